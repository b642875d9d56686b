"""The `corral` command line: click commands and rich rendering, no logic of its own."""

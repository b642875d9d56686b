"""The controller: managed jobs' recovery and re-routing, run by `corral server`."""

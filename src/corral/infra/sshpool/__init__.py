"""`ssh/<pool>`: plain GPU machines reached over SSH, as a backend behind the Infra seam (being built:
so far the inventory of one machine, `inventory.py`)."""

import os
import sys

from corral.controller.server import run

if __name__ == "__main__" and sys.argv[1:] == ["run"]:
    os.umask(0o077)  # everything the controller writes (log, store, keys) is its user's alone
    run()
else:
    sys.exit("usage: python -m corral.controller run (use `corral server start`)")

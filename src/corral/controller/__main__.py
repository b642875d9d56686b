import sys

from corral.controller.server import run

if __name__ == "__main__" and sys.argv[1:] == ["run"]:
    run()
else:
    sys.exit("usage: python -m corral.controller run (use `corral server start`)")

import os
import sys

from corral.controller.server import STARTUP_ERROR, run
from corral.errors import CorralError

if __name__ == "__main__" and sys.argv[1:] == ["run"]:
    os.umask(0o077)  # everything the controller writes (log, store, keys) is its user's alone
    try:
        run()
    except CorralError as exc:  # a broken config.yaml, a port in use: one line `corral server start` shows
        print(f"{STARTUP_ERROR}{exc}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
else:
    sys.exit("usage: python -m corral.controller run (use `corral server start`)")

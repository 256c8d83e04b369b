"""`python -m benchgen_router.frontier`: the same command as `benchgen-router frontier`."""

import sys

from benchgen_router.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["frontier", *sys.argv[1:]], prog="python -m benchgen_router.frontier"))

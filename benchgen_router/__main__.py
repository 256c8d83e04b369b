"""`python -m benchgen_router ...` is the `benchgen-router` command."""

import sys

from benchgen_router.cli.main import main

sys.exit(main(prog="python -m benchgen_router"))

"""`python -m benchgen_router.frontier`, deprecated: warns, then becomes `benchgen-router frontier` with the
same options (the command line lives in benchgen_router/cli/, which the library never imports)."""

from benchgen_router.bench import hand_over_to_command

hand_over_to_command("benchgen_router.frontier", ["frontier"])

"""Benchmarks as library code: routing speed, the service under load, memory of loading and streaming, and
routing value on an outcome matrix (`value/`).

Each runs as `benchgen-router bench [service | load-memory | streaming | value]`; the command line lives
in benchgen_router/cli/ and nothing here imports it.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

REMOVED_IN = "0.4.0"


def hand_over_to_command(old: str, command: list[str]) -> NoReturn:
    """The deprecated `python -m benchgen_router.bench.<module>`: warn, then become the command with the
    same options. exec keeps the process id, so a signal aimed at the old command reaches the new one."""
    print(
        f"warning: python -m {old} is deprecated and goes in {REMOVED_IN}; run `benchgen-router {' '.join(command)}` "
        "(same options).",
        file=sys.stderr,
        flush=True,
    )
    os.execv(sys.executable, [sys.executable, "-m", "benchgen_router", *command, *sys.argv[1:]])

"""benchgen-router bench: the routing speed benchmark (see benchgen_router.bench.routing)."""

from __future__ import annotations

from benchgen_router.bench.routing import add_arguments, run

HELP = "benchmark routing speed side by side with the reference"

__all__ = ["HELP", "add_arguments", "run"]

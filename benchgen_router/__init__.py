"""BenchGen Router Lite tooling: route queries to the agents of an LLM pool, train and evaluate the
router's head, convert releases, benchmark.

    from benchgen_router import pick_agent
    pick_agent("What is the derivative of x^3 + 2x?")["picked_agent"]   # the committed default router

The names below load lazily, so `import benchgen_router` imports neither torch nor transformers.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.3.0"
__all__ = ["EmptyQueryError", "InputError", "RouterError", "RouterTypeError", "load_router", "pick_agent", "run_router"]

_LAZY = {
    "pick_agent": "benchgen_router.routing",
    "run_router": "benchgen_router.routing",
    "EmptyQueryError": "benchgen_router.routing",
    "load_router": "benchgen_router.loading",
    "InputError": "benchgen_router.errors",
    "RouterError": "benchgen_router.errors",
    "RouterTypeError": "benchgen_router.errors",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'benchgen_router' has no attribute {name!r}")

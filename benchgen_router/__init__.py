"""BenchGen Router Lite tooling: route queries to the agents of an LLM pool, train and evaluate the
router's head, convert releases, benchmark.

    from benchgen_router import pick_agent
    pick_agent("What is the derivative of x^3 + 2x?")["picked_agent"]   # the committed default router

The names below load lazily, so `import benchgen_router` imports neither torch nor transformers.
"""

from __future__ import annotations

from benchgen_router.moved import lazy_names

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


__getattr__, __dir__ = lazy_names(__name__, _LAZY)

"""The original release's interface, verbatim:

    python router_head.py "What is the derivative of x^3 + 2x?"     # prints the picked agent

    from router_head import pick_agent
    pick_agent("What is the derivative of x^3 + 2x?")["picked_agent"]   # e.g. "frontier_a"

It routes with the router in this folder (or the one installed with the package): the result dict
holds "picked_agent", "agent_index", "probabilities" and "logits". `embed_query` gives the pooled
embedding the head scores.
"""

from __future__ import annotations

import sys
from typing import Any

from benchgen_router.routing import get_router, pick_agent, run_router

__all__ = ["embed_query", "pick_agent"]


def embed_query(query: str, model: Any = None) -> Any:
    """The float32 masked-mean-pooled backbone embedding of one query (numpy, shape (config.embedding_dim,))."""
    router, tokenizer = get_router(model)
    return run_router(router, tokenizer, [query])[1][0]


if __name__ == "__main__":
    from benchgen_router.cli.main import main

    sys.exit(main(["route", *sys.argv[1:]], prog="router_head.py"))

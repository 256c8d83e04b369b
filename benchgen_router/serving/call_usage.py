"""What a gateway call used: its `usage`, read from the answer or from the stream as it passes, counted
only when believable, and the gateway's Prometheus metrics of the calls (docs/gateway.md, "Metrics").
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ray.serve.metrics import Counter, Histogram

from benchgen_router.upstreams import Upstream

logger = logging.getLogger("benchgen_router.serving")

# A usage event is a few hundred bytes: a stream's line longer than this is relayed, but not kept for
# scanning (bounded memory, and linear time however a stream is cut).
MAX_SCANNED_LINE_BYTES = 64 << 10
# Usage past these is no real call's (a hostile or broken upstream): dropped from the metrics and the
# cost header, and counted apart, so that no series can be poisoned or overflow.
MAX_TOKENS_PER_CALL = 10_000_000
MAX_COST_PER_CALL_USD = 1000.0
LATENCY_BUCKETS_S = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]


@dataclass(frozen=True)
class CallUsage:
    """What a call used, as counted: its tokens and cost (None: not reported, or not priced)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None


def plausible_usage(upstream: Upstream, usage: Mapping[str, Any] | None) -> CallUsage | None:
    """The tokens and cost of a call's `usage`; None when they are not believable (a token count that is
    not a whole number from 0 to MAX_TOKENS_PER_CALL; a cost that is negative, not finite, or over
    MAX_COST_PER_CALL_USD, billed or at the pool's prices): such usage is counted nowhere."""
    if usage is None:
        return CallUsage()
    tokens = []
    for key in ("prompt_tokens", "completion_tokens"):
        count = usage.get(key)
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_TOKENS_PER_CALL
        ):
            return None
        tokens.append(count)
    billed = usage.get("cost")
    if billed is not None and not (
        isinstance(billed, int | float)
        and not isinstance(billed, bool)
        and math.isfinite(billed)
        and 0 <= billed <= MAX_COST_PER_CALL_USD
    ):
        return None
    cost = upstream.cost_usd(usage)
    if cost is not None and not cost <= MAX_COST_PER_CALL_USD:
        return None
    return CallUsage(tokens[0], tokens[1], cost)


def cost_headers(usage: CallUsage | None) -> dict[str, str]:
    """x-benchgen-cost-usd: the upstream's billed usage.cost, else its tokens at the pool's prices;
    absent when neither is known, or the usage is not believable."""
    if usage is None or usage.cost_usd is None:
        return {}
    return {"x-benchgen-cost-usd": f"{usage.cost_usd:.10f}"}


def body_usage(content: bytes) -> dict[str, Any] | None:
    try:
        payload = json.loads(content)
    except (ValueError, RecursionError):
        return None
    usage = payload.get("usage") if isinstance(payload, dict) else None
    return usage if isinstance(usage, dict) else None


class StreamUsage:
    """The last `usage` a stream's data events carried, read as the bytes pass through. OpenAI sends it
    in a final chunk when asked (stream_options.include_usage), as transformers serve does from 5.25."""

    def __init__(self) -> None:
        self.pending = bytearray()  # the line so far; appended to, never copied whole per chunk
        self.overlong = False  # the line so far is past MAX_SCANNED_LINE_BYTES: skipped up to its end
        self.usage: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> None:
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            self.extend(chunk, start, end)
            if not self.overlong:
                self.read_line(bytes(self.pending))
            self.pending.clear()
            self.overlong = False
            start = end + 1
        self.extend(chunk, start, len(chunk))

    def extend(self, chunk: bytes, start: int, end: int) -> None:
        if self.overlong:
            return
        if len(self.pending) + end - start > MAX_SCANNED_LINE_BYTES:
            self.overlong = True
            self.pending.clear()
        else:
            self.pending += chunk[start:end]

    def finish(self) -> None:
        if not self.overlong:
            self.read_line(bytes(self.pending))
        self.pending.clear()
        self.overlong = False

    def read_line(self, line: bytes) -> None:
        if line.startswith(b"data:") and b'"usage"' in line:
            usage = body_usage(line[5:])
            if usage is not None:
                self.usage = usage


class GatewayMetrics:
    """Prometheus metrics of the gateway, per agent (Ray Serve adds the deployment and replica tags)."""

    def __init__(self) -> None:
        self.requests = Counter(
            "benchgen_router_gateway_requests",
            description="Chat completions answered, by agent, kind (routed, passthrough) and status class.",
            tag_keys=("agent", "kind", "status"),
        )
        self.prompt_tokens = Counter(
            "benchgen_router_gateway_prompt_tokens", description="Prompt tokens, by agent.", tag_keys=("agent",)
        )
        self.completion_tokens = Counter(
            "benchgen_router_gateway_completion_tokens", description="Completion tokens, by agent.", tag_keys=("agent",)
        )
        self.cost = Counter(
            "benchgen_router_gateway_cost_usd", description="Cost of the calls in USD, by agent.", tag_keys=("agent",)
        )
        self.failures = Counter(
            "benchgen_router_gateway_upstream_failures",
            description="Upstream calls that failed (timeout, connect, transport, 429, 5xx), by agent and reason.",
            tag_keys=("agent", "reason"),
        )
        self.journal_failures = Counter(
            "benchgen_router_gateway_journal_write_failures",
            description="Traffic journal lines that could not be written (an unwritable folder, a full disk).",
        )
        self.implausible_usage = Counter(
            "benchgen_router_gateway_implausible_usage",
            description="Calls whose usage was not counted: token counts or costs no real call has, by agent.",
            tag_keys=("agent",),
        )
        self.latency = Histogram(
            "benchgen_router_gateway_upstream_latency_seconds",
            description="From the call to the upstream's last byte, by agent and stream (true, false).",
            boundaries=LATENCY_BUCKETS_S,
            tag_keys=("agent", "stream"),
        )

    def answered(self, kind: str, agent: str, status: int) -> None:
        """Count an answer to a client: `kind` routed or passthrough."""
        self.requests.inc(1, tags={"agent": agent, "kind": kind, "status": f"{status // 100}xx"})

    def finished(
        self, upstream: Upstream, usage: Mapping[str, Any] | None, seconds: float, stream: bool
    ) -> CallUsage | None:
        """Count a finished call; its usage as counted (None: not believable, counted apart)."""
        tags = {"agent": upstream.agent}
        self.latency.observe(seconds, tags={**tags, "stream": str(stream).lower()})
        counted = plausible_usage(upstream, usage)
        if counted is None:
            self.implausible_usage.inc(1, tags=tags)
            logger.warning("gateway: agent %s reported usage no call has; not counted", upstream.agent)
            return None
        for counter, tokens in (
            (self.prompt_tokens, counted.prompt_tokens),
            (self.completion_tokens, counted.completion_tokens),
        ):
            if tokens:
                counter.inc(tokens, tags=tags)
        if counted.cost_usd:
            self.cost.inc(counted.cost_usd, tags=tags)
        return counted

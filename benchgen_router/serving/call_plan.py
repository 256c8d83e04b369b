"""One gateway call's plan and record: which agents it tries, in order (the agent picked, then the one a
failure is retried on), the headers that tell the client the router's decision, and the journal line
filled in as the call is answered (serving/gateway.py makes the calls; docs/gateway.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from benchgen_router.serving.call_usage import CallUsage
from benchgen_router.upstreams import Upstream, UpstreamPool


def retry_agent(result: Mapping[str, Any], configured: str | None, router_fallback: str | None) -> str | None:
    """The agent a failed routed call is retried on: the configured fallback, else the router's fallback
    agent for the point, else the head's next choice; never the agent that just failed."""
    picked = result["picked_agent"]
    for agent in (configured, router_fallback):
        if agent is not None and agent != picked:
            return agent
    scores = result["probabilities"]
    return next((agent for agent in sorted(scores, key=scores.get, reverse=True) if agent != picked), None)


@dataclass(frozen=True)
class Plan:
    """A chat completion's calls: the agents to try, in order, and the headers that tell the decision."""

    attempts: tuple[Upstream, ...]
    routed: bool
    decision: Mapping[str, str] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "routed" if self.routed else "passthrough"

    def headers(self, answered: Upstream) -> dict[str, str]:
        headers = {"x-benchgen-agent": answered.agent, "x-benchgen-routed": str(self.routed).lower(), **self.decision}
        if answered is not self.attempts[0]:
            headers["x-benchgen-retried-from"] = self.attempts[0].agent
        return headers


@dataclass
class Journaled:
    """One gateway request's journal line, filled in as the request is answered, and written once."""

    request_id: str
    model: str
    text: str | None  # what the router scored (a pass-through: what it would score), None without user text
    text_cut: bool  # whether `text` was cut to ROUTING_TEXT_MAX_CHARS
    stream: bool
    decision: dict[str, Any] = field(default_factory=dict)  # a routed request's: the router's result
    agent: str | None = None  # the agent being called, then the one that answered
    retried_from: str | None = None
    first_byte_s: float | None = None
    written: bool = False

    def entry(self, status: int, usage: CallUsage | None, total_s: float | None) -> dict[str, Any]:
        usage = usage or CallUsage()
        return {
            "request_id": self.request_id,
            "model": self.model,
            "operating_point": self.decision.get("operating_point"),
            "tradeoff": self.decision.get("tradeoff"),
            "agent": self.agent,
            "head_pick": self.decision.get("head_pick") or self.decision.get("picked_agent"),
            "out_of_distribution": self.decision.get("out_of_distribution"),
            "guard_score": self.decision.get("ood_score"),
            "retried_from": self.retried_from,
            "status": status,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cost_usd": usage.cost_usd,
            "first_byte_s": None if self.first_byte_s is None else round(self.first_byte_s, 6),
            "total_s": None if total_s is None else round(total_s, 6),
            "stream": self.stream,
        }


def routed_plan(
    result: Mapping[str, Any], upstreams: UpstreamPool, configured: str | None, router_fallback: str | None
) -> Plan:
    picked = upstreams.upstreams[result["picked_agent"]]
    retry = retry_agent(result, configured, router_fallback)
    decision = {"x-benchgen-out-of-distribution": "true" if result.get("out_of_distribution") else "false"}
    if result.get("operating_point") is not None:
        decision["x-benchgen-operating-point"] = result["operating_point"]
    if result.get("tradeoff") is not None:  # a probability head: the rule it decided under
        decision["x-benchgen-tradeoff"] = result["tradeoff"]
    attempts = (picked,) if retry is None else (picked, upstreams.upstreams[retry])
    return Plan(attempts=attempts, routed=True, decision=decision)

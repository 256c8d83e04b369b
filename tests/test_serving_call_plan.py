"""A gateway call's plan (serving.call_plan): the agent a failed call is retried on, never the one that
failed, and the headers that tell the client the router's decision."""

from __future__ import annotations

from benchgen_router.serving.call_plan import Plan, retry_agent, routed_plan
from benchgen_router.upstreams import Upstream, UpstreamPool

AGENTS = ["alpha", "beta"]
UPSTREAMS = {agent: Upstream(agent, f"served-{agent}", "http://127.0.0.1:9/v1") for agent in AGENTS}
POOL = UpstreamPool(agents=tuple(AGENTS), upstreams=UPSTREAMS)


def test_a_failed_call_is_retried_on_the_fallback_and_never_on_the_agent_that_failed():
    result = {"picked_agent": "alpha", "probabilities": {"alpha": 0.7, "beta": 0.3}}
    assert retry_agent(result, "beta", None) == "beta"  # --gateway-fallback
    assert retry_agent(result, None, "beta") == "beta"  # the router's fallback agent for the point
    assert retry_agent(result, None, None) == "beta"  # the head's next choice
    assert retry_agent(result, "alpha", "alpha") == "beta"  # the fallback is the agent that failed
    assert retry_agent({"picked_agent": "alpha", "probabilities": {"alpha": 1.0}}, None, None) is None
    flagged = {**result, "operating_point": "fast", "out_of_distribution": True, "head_pick": "beta"}
    plan = routed_plan(flagged, POOL, None, None)
    assert [up.agent for up in plan.attempts] == ["alpha", "beta"]
    assert plan.headers(plan.attempts[0]) == {
        "x-benchgen-agent": "alpha",
        "x-benchgen-routed": "true",
        "x-benchgen-out-of-distribution": "true",
        "x-benchgen-operating-point": "fast",
    }
    assert plan.headers(plan.attempts[1])["x-benchgen-retried-from"] == "alpha"
    passthrough = Plan(attempts=(POOL.upstreams["beta"],), routed=False)
    assert passthrough.headers(POOL.upstreams["beta"]) == {"x-benchgen-agent": "beta", "x-benchgen-routed": "false"}

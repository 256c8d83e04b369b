"""The service's documented shapes (routes and statuses in docs/service.md): what /v1/route takes and
answers, /v1/pool and /healthz answer, and the one-line error body. FastAPI publishes them at /docs and
/openapi.json; the routes read and check bodies themselves (serving/request_checks.py)."""

from typing import Any

from pydantic import BaseModel, Field

from benchgen_router.serving.request_checks import DEFAULT_MAX_QUERIES, DEFAULT_MAX_REQUEST_BYTES


class RouteRequest(BaseModel):
    queries: list[str] = Field(
        min_length=1,
        description=f"Queries to route, at most {DEFAULT_MAX_QUERIES} per request by default "
        f"(and {DEFAULT_MAX_REQUEST_BYTES} bytes of body); each must hold text the router can read.",
        examples=[["What is the derivative of x^3 + 2x?"]],
    )
    operating_point: str | None = Field(
        None,
        description="For a router trained at several quality/cost/latency trade-offs: the operating point "
        "(head) that routes these queries, one of the names GET /v1/pool lists under operating_points. "
        "Absent or null: the service's default (marked there). A router with one head refuses it (422).",
        examples=["quality"],
    )
    tradeoff: str | None = Field(
        None,
        description="For a router with a probability head: the rule that picks the agent from each agent's "
        "probability of answering well, tolerance=T, lambda=L, budget=X, budget=X@AGENT or usd-per-1k=Y "
        "(docs/tradeoff.md). Absent or null: the most likely agent. A bad spelling, or a router without a "
        "probability head, is a 400.",
        examples=["budget=0.3"],
    )


class RouteResult(BaseModel):
    picked_agent: str = Field(description="The agent that should answer (argmax of the logits).")
    agent_index: int = Field(description="Its position in the pool.")
    probabilities: dict[str, float] = Field(
        description="Softmax of the logits, by agent id, pool order (a probability head: each agent's own "
        "probability of answering well, which need not sum to 1)."
    )
    logits: dict[str, float] = Field(description="The head's raw score of each agent, pool order.")
    operating_point: str | None = Field(
        None, description="Routers with operating points: the point whose head scored this query."
    )
    tradeoff: str | None = Field(
        None, description="Routers with a probability head: the rule that picked this query's agent."
    )
    out_of_distribution: bool | None = Field(
        None, description="Routers with a guard: the query is unlike the training distribution."
    )
    ood_score: float | None = Field(None, description="Routers with a guard: the guard's score (higher: further out).")
    head_pick: str | None = Field(
        None, description="Flagged queries: the head's own choice (picked_agent is then the fallback agent)."
    )


class RouterInfo(BaseModel):
    name: str = Field(description="The router asked for ('default' for the bundled one).")
    revision: str | None = Field(description="Its revision: the one asked for, the Hub commit, or a weights digest.")


class RouteResponse(BaseModel):
    results: list[RouteResult] = Field(description="One result per query, in request order.")
    router: RouterInfo


class PoolAgent(BaseModel):
    id: str
    slug: str | None = Field(None, description="The model this agent resolves to (with a pool file).")
    price_per_1m_prompt_usd: float | None = Field(None, description="With a pool file.")
    price_per_1m_output_usd: float | None = Field(None, description="With a pool file.")


class OperatingPoint(BaseModel):
    name: str = Field(description="What a request sends as operating_point.")
    cost_weight: float = Field(description="Reward given up per USD per 1,000 queries saved, in training.")
    latency_weight: float = Field(description="Reward given up per second per query saved, in training.")
    default: bool = Field(description="The point requests without operating_point are routed at.")


class PoolResponse(BaseModel):
    agents: list[PoolAgent] = Field(description="The router's agents, in pool (logit) order.")
    operating_points: list[OperatingPoint] | None = Field(
        None, description="Routers trained at several trade-offs: their operating points, by name."
    )
    router: RouterInfo


class ErrorResponse(BaseModel):
    error: str = Field(description="One line naming the problem and the fix.")


class HealthProblem(ErrorResponse):
    status: str = Field(description="loading (retry soon), or failed (the router cannot serve; see the log).")


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (400, "The body is not a JSON object, or its tradeoff is not a rule this router has."),
        (408, "The body did not arrive in time."),
        (413, "More queries or bytes than the service's per-request limits."),
        (422, "No queries, a query that is not text or that the router cannot score, or an unknown operating point."),
        (503, "The router is loading, or has more queries waiting than it takes: retry (Retry-After)."),
    )
}

"""LiteLLM plugins over a router folder (docs/integrations/litellm.md): the router picks which deployment
answers, inside the LiteLLM Router or Proxy users already run.

    from benchgen_router.integrations.litellm import BenchgenClassifierPlugin, BenchgenRoutingPlugin

    routing = BenchgenRoutingPlugin("path/or/hub-id", agents={"frontier_a": "openai/gpt-4o", ...})
    Router(model_list=..., plugins=[routing])             # narrows each request's candidate deployments
    classifier = BenchgenClassifierPlugin("path/or/hub-id", tiers={"frontier_a": "COMPLEX", ...})
    # complexity_router_config: {classifier_type: custom, classifier_plugin: classifier, ...}

`agents` names, for each agent of the router's pool, the candidate string LiteLLM hands a routing plugin:
a deployment's `litellm_params.model` for `Router(plugins=...)` / `router_settings.plugins`, a model_name
inside `complexity_router_config.plugins`. `tiers` names each agent's tier (or a `tier_definitions` name).
Per request, metadata keys override the plugin's default decision:

    benchgen_tradeoff         a probability head's rule ("budget=0.3", "tolerance=0.02", ...)
    benchgen_operating_point  a CMA-ES router's operating point ("quality", ...)

The decision goes back in `context.signals["benchgen_router"]`, which LiteLLM returns to the caller as
metadata["routing_plugin_signals"]; on the Proxy, litellm_proxy.response_headers sends it as headers.
Whatever fails (the router does not load, a bad rule, no text, an agent without a model), LiteLLM's own
choice stands: the context comes back unchanged (the classifier says None) and one log line says why,
never with the request's text; the plugins never fail a request.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any

from benchgen_router.chat_text import ROUTE_ON, routing_text
from benchgen_router.errors import InputError, RouterTypeError
from benchgen_router.integrations.engine import RouterSource, RoutingFailed, engine_for
from benchgen_router.serving.logs import RepeatedWarnings

# LiteLLM fetches its model price map from GitHub when imported, unless told to use the copy it ships.
# A router has no use for fresher prices, and a gateway should not reach the network because it routes:
# set before LiteLLM is imported by anything that imports this module first (the user's own setting wins).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

logger = logging.getLogger("benchgen_router.integrations.litellm")

SIGNALS_KEY = "benchgen_router"
TRADEOFF_KEY = "benchgen_tradeoff"
OPERATING_POINT_KEY = "benchgen_operating_point"
# LiteLLM's own record of a narrowed candidate list on the request's metadata. It is written only when a
# plugin narrows and never cleared, so a later attempt of the same request (a fallback group) would be
# filtered by an earlier group's choice and find no deployment left: each run leaves it at its own choice.
LITELLM_CANDIDATES_KEY = "_routing_plugin_candidate_models"
# The router reads only the start of a text (its truncation length, 512 tokens for the default router):
# tokenizing more would only cost time on the worker thread, beside every query of the pass.
DEFAULT_TIMEOUT_S = 10.0
# LiteLLM gives a classifier plugin 3 s (classifier_plugin_timeout_ms) and then falls back itself: the
# classifier gives up first, so that its log line says why.
DEFAULT_CLASSIFIER_TIMEOUT_S = 2.5
# What a fallback line starts with, one kind each: a repeated kind is logged once a minute with its count.
FALLBACK_KINDS = (
    "the router did not load",
    "the router refused",
    "no text to route on",
    "no LiteLLM model for",
    "the router took longer than",
    "unexpected error",
)


def check_mapping(mapping: Any, name: str, values: str) -> dict[str, str]:
    """A plugin's agent mapping as a dict, or InputError naming what is wrong with it."""
    if not isinstance(mapping, Mapping) or not mapping:
        raise RouterTypeError(f"{name} must map each agent id of the router's pool to {values}; got {mapping!r}.")
    bad = [(agent, value) for agent, value in mapping.items() if not (isinstance(agent, str) and agent)]
    bad += [(agent, value) for agent, value in mapping.items() if not (isinstance(value, str) and value)]
    if bad:
        raise InputError(f"{name}: {bad[0][0]!r} -> {bad[0][1]!r}: agent ids and {values} are non-empty strings.")
    return dict(mapping)


def decision_headers(signals: Mapping[str, Any]) -> dict[str, str]:
    """The x-benchgen-* response headers of a plugin's signals (the gateway's names, docs/gateway.md)."""
    if not signals.get("routed"):
        return {"x-benchgen-routed": "false", "x-benchgen-reason": ascii_header(str(signals.get("reason", "")))}
    headers = {"x-benchgen-routed": "true", "x-benchgen-agent": ascii_header(str(signals["agent"]))}
    for key, header in (("operating_point", "x-benchgen-operating-point"), ("tradeoff", "x-benchgen-tradeoff")):
        if signals.get(key) is not None:
            headers[header] = ascii_header(str(signals[key]))
    if signals.get("out_of_distribution") is not None:
        headers["x-benchgen-out-of-distribution"] = "true" if signals["out_of_distribution"] else "false"
    return headers


def ascii_header(value: str) -> str:
    """A header value HTTP can carry: ASCII, other characters escaped, no line breaks."""
    return value.encode("ascii", "backslashreplace").decode("ascii").replace("\r", " ").replace("\n", " ")


class _RouterPlugin:
    """What both plugins share: the router (one engine per router and process), the default decision, and
    one request's decision with every failure turned into a reason.

    `model`: a router folder or Hub id (None: the default router); `operating_point` / `tradeoff`: the
    decision for requests whose metadata names none (None: the router's default); `route_on`: the text
    scored (last-user, first-user, conversation); `timeout_s`: past it, LiteLLM's choice stands; `device`,
    `dtype`, `revision`, `backbone`: loading options, as pick_agent's."""

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        *,
        operating_point: str | None = None,
        tradeoff: str | None = None,
        route_on: str = "last-user",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        device: str | None = None,
        dtype: str | None = None,
        revision: str | None = None,
        backbone: str | None = None,
    ) -> None:
        for name, value in (("operating_point", operating_point), ("tradeoff", tradeoff)):
            if value is not None and not isinstance(value, str):
                raise RouterTypeError(f"{name} must be a string or None, got {type(value).__name__}.")
        if route_on not in ROUTE_ON:
            raise InputError(f"route_on={route_on!r}: choose one of {', '.join(ROUTE_ON)}.")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
            raise InputError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}.")
        name = None if model is None else os.fspath(model)
        if name is not None and os.path.isdir(name):  # one engine however the folder is spelled
            name = os.path.abspath(name)
        self.source = RouterSource(name, device, dtype, revision, backbone)
        self.operating_point = operating_point
        self.tradeoff = tradeoff
        self.route_on = route_on
        self.timeout_s = float(timeout_s)
        self._warnings = RepeatedWarnings(FALLBACK_KINDS)

    async def _decide(self, context: Any, mapping: Mapping[str, str]) -> dict[str, Any]:
        """The router's result for this request, or RoutingFailed: the request's own settings from its
        metadata, its text from its messages, and every pool agent named in `mapping`."""
        metadata = context.metadata if isinstance(context.metadata, Mapping) else {}
        overrides = {}
        for key, setting in ((OPERATING_POINT_KEY, "operating_point"), (TRADEOFF_KEY, "tradeoff")):
            value = metadata.get(key)
            if value is not None and not isinstance(value, str):
                raise RoutingFailed(f"the router refused metadata {key}: a {type(value).__name__}, not a string")
            overrides[setting] = value if value is not None else getattr(self, setting)
        try:
            text = routing_text(list(context.structured_messages or context.raw_messages or []), self.route_on).text
        except InputError as err:
            raise RoutingFailed(f"no text to route on: {err}") from None
        engine = engine_for(self.source)
        try:
            result = await asyncio.wait_for(engine.route(text, **overrides), self.timeout_s)
        except TimeoutError:
            raise RoutingFailed(f"the router took longer than {self.timeout_s:g} s (timeout_s; loading?)") from None
        unmapped = [agent for agent in result["probabilities"] if agent not in mapping]
        if unmapped:
            raise RoutingFailed(f"no LiteLLM model for the pool's agent(s) {unmapped}; add them to the mapping")
        return result

    def _fell_back(self, reason: str) -> None:
        """One warning line per failed request (a repeated kind once a minute), never with its text."""
        if not logger.isEnabledFor(logging.WARNING):
            return
        record = logger.makeRecord(
            logger.name, logging.WARNING, __file__, 0, "benchgen-router: LiteLLM's choice stands: %s", (reason,), None
        )
        if self._warnings.filter(record):
            logger.handle(record)


def decided_signals(result: Mapping[str, Any], agent: str, model: str) -> dict[str, Any]:
    """What a routed request reports: the agent chosen, its LiteLLM model, the router's own pick when it was
    not a candidate, the setting decided under and every agent's probability."""
    signals: dict[str, Any] = {"routed": True, "agent": agent, "model": model}
    if result["picked_agent"] != agent:
        signals["router_pick"] = result["picked_agent"]
    for key in ("operating_point", "tradeoff", "out_of_distribution"):
        if key in result:
            signals[key] = result[key]
    signals["probabilities"] = dict(result["probabilities"])
    return signals


class BenchgenRoutingPlugin(_RouterPlugin):
    """A LiteLLM RoutingPlugin: narrows each request's candidate models to the deployments of the agent the
    router picks (`agents`: agent id -> candidate string). Candidates no agent maps to are a model group
    outside the pool, left as LiteLLM gives them; when the agent picked is not among a group's candidates
    (a fallback group), the candidate agent the router scores most likely is taken. Settings: _RouterPlugin's."""

    def __init__(self, model: str | os.PathLike | None = None, *, agents: Mapping[str, str], **settings: Any) -> None:
        self.agents = check_mapping(agents, "agents", "LiteLLM model strings")
        super().__init__(model, **settings)

    async def run(self, context: Any) -> Any:
        candidates = list(context.candidate_models)
        keep = candidates
        try:
            in_group = [agent for agent, model in self.agents.items() if model in candidates]
            if not in_group:  # another model group, or a call to one deployment by id (no candidates)
                return context
            result = await self._decide(context, self.agents)
            agent = result["picked_agent"]
            if agent not in in_group:
                agent = max(in_group, key=lambda name: result["probabilities"][name])
            keep = [model for model in candidates if model == self.agents[agent]]
            context.signals[SIGNALS_KEY] = decided_signals(result, agent, self.agents[agent])
        except RoutingFailed as err:
            self._fell_back(str(err))
            context.signals[SIGNALS_KEY] = {"routed": False, "reason": str(err)}
        except Exception as err:  # never fail the request: LiteLLM retries a raising plugin, then fails it
            logger.debug("the routing plugin failed", exc_info=True)
            self._fell_back(f"unexpected error ({type(err).__name__})")
            context.signals[SIGNALS_KEY] = {"routed": False, "reason": f"unexpected error ({type(err).__name__})"}
        finally:
            context.candidate_models = keep
            earlier = context.metadata.get(LITELLM_CANDIDATES_KEY) if isinstance(context.metadata, Mapping) else None
            if candidates and isinstance(earlier, list):  # the request's own list: the context copies the dict only
                earlier[:] = keep
        return context


class BenchgenClassifierPlugin(_RouterPlugin):
    """A LiteLLM ClassifierPlugin for the complexity auto-router (`classifier_type: custom`): the tier of the
    agent the router picks (`tiers`: agent id -> tier name, its label, or a tier_definitions name), or None,
    after which LiteLLM's classifier_fallback decides. Settings: _RouterPlugin's (timeout_s 2.5 s here)."""

    def __init__(self, model: str | os.PathLike | None = None, *, tiers: Mapping[str, str], **settings: Any) -> None:
        self.tiers = check_mapping(tiers, "tiers", "tier names")
        super().__init__(model, **{"timeout_s": DEFAULT_CLASSIFIER_TIMEOUT_S, **settings})

    async def classify(self, context: Any) -> str | None:
        try:
            result = await self._decide(context, self.tiers)
        except RoutingFailed as err:
            self._fell_back(str(err))
            return None
        except Exception as err:  # LiteLLM would fall back too, with a warning that holds the message
            logger.debug("the classifier plugin failed", exc_info=True)
            self._fell_back(f"unexpected error ({type(err).__name__})")
            return None
        logger.debug("benchgen-router: tier %s (agent %s)", self.tiers[result["picked_agent"]], result["picked_agent"])
        return self.tiers[result["picked_agent"]]

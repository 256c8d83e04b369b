"""Where each agent of a pool answers: an OpenAI-compatible endpoint, the model name it answers to,
and the environment variable that holds its key (never the key itself).

The pool file is agents.json as the trainer reads it, with these keys per agent or, in the object
form `{"base_url": ..., "api_key_env": ..., "agents": [...]}`, as defaults for the whole pool:

- `base_url`: the endpoint's OpenAI-compatible root, e.g. https://openrouter.ai/api/v1;
- `model`: the model name sent upstream (default: the agent's slug, else its id);
- `api_key_env`: the name of the environment variable holding the key (none: no key is sent).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from benchgen_router.costs import TOKENS_PER_PRICE_UNIT, pool_agents, read_pool_rows
from benchgen_router.errors import InputError

UPSTREAM_KEYS = ("base_url", "model", "api_key_env")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Upstream:
    """One agent's endpoint. It holds the key's variable name only, so no repr or log shows a key."""

    agent: str
    model: str
    base_url: str
    api_key_env: str | None = None
    slug: str | None = None
    price_per_1m_prompt_usd: float | None = None
    price_per_1m_output_usd: float | None = None

    def api_key(self, environ: Mapping[str, str] = os.environ) -> str | None:
        return environ.get(self.api_key_env) if self.api_key_env else None

    def headers(self, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
        key = self.api_key(environ)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def cost_usd(self, usage: Mapping[str, Any] | None) -> float | None:
        """What a call cost: the upstream's own billed figure when it reports one (OpenRouter's
        usage.cost), else its tokens at the pool's prices; None when neither is known."""
        if not isinstance(usage, Mapping):
            return None
        billed = usage.get("cost")
        if _is_amount(billed):
            return float(billed)
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        prices = (self.price_per_1m_prompt_usd, self.price_per_1m_output_usd)
        if not all(_is_amount(value) for value in (prompt, completion, *prices)):
            return None
        return (prompt * prices[0] + completion * prices[1]) / TOKENS_PER_PRICE_UNIT


def mask_keys(text: str, keys: Iterable[str | None]) -> str:
    """`text` with each key in it replaced by ***: an upstream that echoes a key back (a 401's "Incorrect API
    key provided: Bearer sk-...") must not hand it to whoever reads its answer, a client or a log."""
    for key in keys:
        if key:
            text = text.replace(key, "***")
    return text


def retryable_status(status: int) -> bool:
    """Whether an upstream's answer is worth another try: rate-limited (429) or failing (5xx)."""
    return status == 429 or status >= 500


def _is_amount(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


@dataclass(frozen=True)
class UpstreamPool:
    """The pool's agents in file order, each with its endpoint."""

    agents: tuple[str, ...]
    upstreams: Mapping[str, Upstream]

    def resolve(self, name: str) -> Upstream | None:
        """The upstream a request's model name means: an agent id, else a slug or upstream model."""
        if name in self.upstreams:
            return self.upstreams[name]
        return next((up for up in self.upstreams.values() if name in (up.slug, up.model)), None)


def url_problem(url: Any) -> str | None:
    """Why `url` cannot be an endpoint's root, in a few words; None when it can."""
    if not isinstance(url, str) or not url.strip():
        return f"base_url {url!r} is not a URL"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"base_url {url!r} is not an http(s) URL with a host"
    if parts.username or parts.password:
        return "base_url holds credentials; put the key in an environment variable named by api_key_env"
    if parts.query or parts.fragment:
        return f"base_url {url!r} has a query or fragment; give the API's root, e.g. https://host/v1"
    try:
        parts.port  # noqa: B018 (an out-of-range port raises here)
    except ValueError:
        return f"base_url {url!r} has an invalid port"
    return None


def _upstream_problems(agent: str, row: Mapping[str, Any], environ: Mapping[str, str]) -> list[str]:
    problems = []
    problem = url_problem(row.get("base_url"))
    if problem:
        problems.append(
            f"agent '{agent}': {problem}" if row.get("base_url") is not None else f"agent '{agent}' has no base_url"
        )
    model = row.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        problems.append(f"agent '{agent}': model {model!r} is not a model name")
    env = row.get("api_key_env")
    if env is not None:
        if not isinstance(env, str) or not _ENV_NAME.match(env):
            problems.append(f"agent '{agent}': api_key_env {env!r} is not an environment variable name")
        elif not environ.get(env):
            problems.append(f"agent '{agent}': environment variable {env} (its api_key_env) is not set")
    return problems


def read_upstream_pool(
    path: str | os.PathLike, agents: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ
) -> UpstreamPool:
    """The pool file's upstreams, every problem found at once and reported one per line: an agent
    the router does not know or that the file lacks, a bad or missing base_url, an unset key."""
    source = f"pool file {path}"
    document = read_pool_rows(path)
    defaults: dict[str, Any] = {}
    rows = document
    if isinstance(document, dict):
        defaults = {key: document[key] for key in ("base_url", "api_key_env") if key in document}
        rows = document.get("agents")
    entries = pool_agents(rows, source)  # ids, slugs and prices, checked
    problems: list[str] = []
    upstreams: dict[str, Upstream] = {}
    for entry, row in zip(entries, rows, strict=True):
        merged = {**defaults, **{key: row[key] for key in UPSTREAM_KEYS if key in row}}
        found = _upstream_problems(entry["id"], merged, environ)
        problems += found
        if not found:
            upstreams[entry["id"]] = Upstream(
                agent=entry["id"],
                model=merged.get("model") or entry["slug"] or entry["id"],
                base_url=merged["base_url"].rstrip("/"),
                api_key_env=merged.get("api_key_env"),
                slug=entry["slug"],
                price_per_1m_prompt_usd=entry["price_per_1m_prompt_usd"],
                price_per_1m_output_usd=entry["price_per_1m_output_usd"],
            )
    listed = [entry["id"] for entry in entries]
    if agents is not None:
        problems += [f"the router's agent '{agent}' is not in the file" for agent in agents if agent not in listed]
        problems += [
            f"agent '{agent}' is not one of the router's {list(agents)}" for agent in listed if agent not in agents
        ]
    if problems:
        raise InputError("\n".join(f"{source}: {problem}" for problem in problems))
    return UpstreamPool(agents=tuple(listed), upstreams=upstreams)

"""The rules a router's config.json must follow, checked once where the package reads or writes one
(loading a router, converting or training one). The remote code (configuration_router.py) describes
the settings and trusts them: its config is written by this package.
"""

from __future__ import annotations

import math
import re
from typing import Any

# Operating point names are module names in the state dict (head.<name>.weight): no dots, not numeric.
OPERATING_POINT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
# "cmaes": the head's argmax is the pick (the release's method). "probability": the head's sigmoid is each
# agent's probability of answering correctly, and a trade-off rule given per request picks (docs/tradeoff.md).
HEAD_KINDS = ("cmaes", "probability")
QUANTILE_LEVELS = [i / 100 for i in range(101)]  # levels of the calibration sample's margin quantiles


def check_router_config(config: Any) -> None:
    """A ValueError naming the first setting of a RouterConfig that breaks its rules."""
    if config.head_hidden_dim < 0:
        raise ValueError(f"head_hidden_dim must be >= 0 (0 means a linear head), got {config.head_hidden_dim}.")
    if config.truncation_length < 1:
        raise ValueError(f"truncation_length must be a positive number of tokens, got {config.truncation_length}.")
    if not 0 <= config.truncation_suffix_tokens <= config.special_tokens_per_query:
        raise ValueError(
            f"truncation_suffix_tokens ({config.truncation_suffix_tokens}) must lie between 0 and "
            f"special_tokens_per_query ({config.special_tokens_per_query}): the suffix is part of the special tokens."
        )
    if config.ood_threshold is not None and not math.isfinite(config.ood_threshold):
        raise ValueError(f"ood_threshold must be a finite number (or None for no guard), got {config.ood_threshold}.")
    check_operating_points(config.operating_points)
    config.check_settings()  # the operating point, the default trade-off and the pooling
    check_query_format(config.query_format)
    if config.head_kind not in HEAD_KINDS:
        raise ValueError(f"head_kind must be one of {', '.join(HEAD_KINDS)}, got {config.head_kind!r}.")
    if config.head_kind == "probability" and (config.operating_points or config.head_hidden_dim):
        raise ValueError("a probability head is one linear layer: it takes no operating_points or head_hidden_dim.")
    pool = list((config.id2label or {}).values())
    if config.ood_threshold is not None and config.ood_fallback_agent not in pool:
        raise ValueError(
            f"ood_fallback_agent {config.ood_fallback_agent!r} is not an agent of this pool {pool}; "
            "name the agent that answers flagged queries."
        )
    for name, settings in config.operating_points.items():
        agent = settings.get("ood_fallback_agent")
        if agent is not None and agent not in pool:
            raise ValueError(f"operating point {name!r}: ood_fallback_agent {agent!r} is not an agent of {pool}.")


def check_operating_points(points: dict[str, dict[str, Any]] | None) -> None:
    """A ValueError unless every operating point has a valid name and trade-off weights >= 0."""
    if not points:
        return
    if not isinstance(points, dict):
        raise ValueError(f"operating_points must be a dict of name -> settings, got {type(points).__name__}.")
    for name, settings in points.items():
        if not isinstance(name, str) or not OPERATING_POINT_NAME.match(name):
            raise ValueError(
                f"operating point name {name!r} must start with a letter and hold only letters, digits, '_' or '-'."
            )
        for key in ("cost_weight", "latency_weight"):
            value = settings.get(key) if isinstance(settings, dict) else None
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"operating point {name!r} needs a number {key} >= 0, got {value!r}.")


def check_query_format(rules: dict[str, Any] | None) -> None:
    """A ValueError unless the canonicalisation rules hold only 'labels' and 'instructions' lists of strings."""
    if not rules:
        return
    if not isinstance(rules, dict) or set(rules) - {"labels", "instructions"}:
        raise ValueError("query_format must be a dict with only 'labels' and 'instructions' (lists of strings).")
    for key, values in rules.items():
        if not isinstance(values, list) or not all(isinstance(value, str) and value.strip() for value in values):
            raise ValueError(f"query_format[{key!r}] must be a list of non-empty strings, got {values!r}.")

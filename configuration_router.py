"""Configuration of BenchGen Router Lite: a frozen text backbone, masked mean pooling, a tiny head.

This file is executed by users through `trust_remote_code=True`: it only describes data, imports
nothing but transformers, and never touches the network.
"""

from __future__ import annotations

import math
import os
from typing import Any

from transformers import AutoConfig, PretrainedConfig
from transformers import __version__ as transformers_version

DEFAULT_TRUNCATION_LENGTH = 1024  # the reference embeds with truncation=True, max_length=1024
DEFAULT_TRADEOFF = "tolerance=0"  # a probability head with no trade-off given: the most likely agent
# What the head reads: the mean of the last hidden state (the reference's), or the means of every hidden state
# the backbone returns (its input embeddings', then each layer's), side by side.
POOLINGS = ("last-layer", "every-layer")
TRADEOFF_FORMS = "tolerance=T (0-1), lambda=L (>= 0), budget=X (0-1) or budget=X@AGENT, usd-per-1k=Y (>= 0)"
AUTO_MAP = {
    "AutoConfig": "configuration_router.RouterConfig",
    "AutoModel": "modeling_router.RouterModel",
    "AutoModelForSequenceClassification": "modeling_router.RouterModel",
}
# pipeline("text-classification", model=<router>, trust_remote_code=True) runs modeling_router.RouterPipeline.
PIPELINE = {"impl": "modeling_router.RouterPipeline", "pt": ["AutoModelForSequenceClassification"]}


class RouterConfig(PretrainedConfig):
    r"""Configuration of a [`RouterModel`]: a backbone, a head per operating point, an optional guard.

    Args:
        text_config: the backbone's complete configuration (any `AutoConfig` type; not `backbone_config`,
            which transformers 5.x reserves for vision backbones).
        backbone_name_or_path / backbone_revision: where a head-only checkpoint's backbone comes from (a Hub
            id such as "Qwen/Qwen3-1.7B", or a local folder) and the revision pinned for reproducibility.
        bundled_backbone: `model.safetensors` holds the backbone's weights too (no second repository).
        pooling: "last-layer" (the reference's: the masked mean of the last hidden state) or "every-layer" (the
            masked means of every hidden state the backbone returns, the input embeddings' first, concatenated:
            (layers + 1) x hidden numbers).
        head_hidden_dim: 0 for a linear head `emb @ W + b`; H > 0 for `tanh(emb @ W1 + b1) @ W2 + b2`.
        truncation_length: queries are cut to this many tokens, as when the head was trained.
        special_tokens_per_query / truncation_suffix_tokens: special tokens the tokenizer adds to every query
            (0 for Qwen, 2 for BERT's [CLS]/[SEP]; a query with no more tokens is empty) and how many of them
            follow the text (kept when the model truncates, as tokenizer truncation keeps BERT's [SEP]).
        pack_queries: let the package lay a batch's queries several to a row on a causal decoder (same picks).
        ood_threshold: the out-of-distribution guard's threshold (None: no guard). `model.safetensors` then
            holds `ood_mean`, `ood_precision` (and with `ood_discriminative`, `ood_weight`,
            `ood_distance_weight`, `ood_bias`); a query scoring above the threshold is flagged.
        ood_fallback_agent: the agent that answers flagged queries; `ood_guard=False` switches the guard off;
            `ood_score` says what the score is (informational).
        operating_points: heads trained at several quality/cost/latency trade-offs, `{name: {"cost_weight": c,
            "latency_weight": l, "ood_fallback_agent": ...}}` (`head.<name>.weight`, ...); empty: one head.
        operating_point: the point that answers when none is given (default: the first name).
        query_format: `{"labels": [...], "instructions": [...]}`: instruction paragraphs and a leading label
            dropped before tokenizing (see `canonical_query`); empty: queries as given, as the reference.
        head_kind: "cmaes" (the pick is the argmax) or "probability" (each agent's sigmoid is its probability of
            answering correctly, and a trade-off rule picks: docs/tradeoff.md), with `agent_costs_per_1k` (USD
            per 1,000 queries, `id2label` order) and `tradeoff_calibration`, what the budget rules need: each
            agent's margin quantiles at evenly spaced levels from 0 to 1, and the `lambda` rule's cost over a
            grid of lambdas. `model.safetensors` holds them (`tradeoff.margins` (agents, levels),
            `tradeoff.lambdas`, `tradeoff.cost_per_1k`) and the config their sizes, `{"rows": sample size,
            "levels": L, "lambdas": K}`; a config written before holds the values themselves (`margins`
            by agent, `lambdas`, `cost_per_1k`). `tradeoff`: the rule a query without one is decided by.
        neighbour_outcomes: k > 0 gives a probability head, beside the embedding, what the k training queries
            nearest a query (cosine) say of each agent: the smoothed log-odds of their mean reward.
            `model.safetensors` holds the `neighbour_rows` training queries as `neighbours.embeddings` (unit
            length) and `neighbours.rewards` (rows, agents); 0: none.
        id2label / label2id: the agent pool in logit order.
    """

    model_type = "benchgen_router"
    sub_configs = {"text_config": AutoConfig}

    def __init__(
        self,
        text_config: dict[str, Any] | PretrainedConfig | None = None,
        backbone_name_or_path: str | os.PathLike | None = None,
        backbone_revision: str | None = None,
        bundled_backbone: bool = False,
        pooling: str = "last-layer",
        head_hidden_dim: int = 0,
        truncation_length: int = DEFAULT_TRUNCATION_LENGTH,
        special_tokens_per_query: int = 0,
        truncation_suffix_tokens: int = 0,
        pack_queries: bool = True,
        ood_threshold: float | None = None,
        ood_fallback_agent: str | None = None,
        ood_guard: bool = True,
        ood_score: str | None = None,
        ood_discriminative: bool = False,
        operating_points: dict[str, dict[str, Any]] | None = None,
        operating_point: str | None = None,
        query_format: dict[str, list[str]] | None = None,
        head_kind: str = "cmaes",
        agent_costs_per_1k: list[float] | None = None,
        tradeoff_calibration: dict[str, Any] | None = None,
        tradeoff: str | None = None,
        neighbour_outcomes: int = 0,
        neighbour_rows: int = 0,
        **kwargs: Any,
    ) -> None:
        if isinstance(text_config, dict):
            text_config = rope_for_this_version(dict(text_config))
            if "model_type" not in text_config:
                raise ValueError("text_config needs a 'model_type' (for example 'qwen3').")
            text_config = AutoConfig.for_model(text_config.pop("model_type"), **text_config)
        self.text_config = text_config
        self.backbone_name_or_path = backbone_name_or_path
        self.backbone_revision = backbone_revision
        self.bundled_backbone = bundled_backbone
        self.pooling = pooling
        self.head_hidden_dim = head_hidden_dim
        self.truncation_length = truncation_length
        self.special_tokens_per_query = special_tokens_per_query
        self.truncation_suffix_tokens = truncation_suffix_tokens
        self.pack_queries = pack_queries
        self.ood_threshold = None if ood_threshold is None else float(ood_threshold)
        self.ood_fallback_agent = ood_fallback_agent
        self.ood_guard = bool(ood_guard)
        self.ood_score = ood_score
        self.ood_discriminative = bool(ood_discriminative)
        self.operating_points = dict(operating_points or {})
        self.operating_point = operating_point or min(self.operating_points, default=None)
        self.query_format = dict(query_format or {})
        self.head_kind = head_kind
        self.agent_costs_per_1k = None if agent_costs_per_1k is None else [float(c) for c in agent_costs_per_1k]
        self.tradeoff_calibration = tradeoff_calibration
        self.tradeoff = tradeoff  # a probability head's rule when a query names none (None: DEFAULT_TRADEOFF)
        self.neighbour_outcomes = neighbour_outcomes
        self.neighbour_rows = neighbour_rows
        kwargs.setdefault("auto_map", dict(AUTO_MAP))  # the files and classes transformers loads the router with
        kwargs.setdefault("custom_pipelines", {"text-classification": dict(PIPELINE)})
        super().__init__(**kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        # Paths are stored as strings: the config is saved, and its repr built, as JSON. from_pretrained
        # sets config attributes passed as keyword arguments directly, so __init__ alone would miss them.
        if name == "backbone_name_or_path" and isinstance(value, os.PathLike):
            value = os.fspath(value)
        super().__setattr__(name, value)

    @property
    def agent_order(self) -> list[str]:
        """The agent ids in logit order."""
        return [self.id2label[i] for i in range(len(self.id2label))]

    def check_operating_point(self, name: str | None) -> str | None:
        """The operating point `name` (None: the configured one), or a ValueError naming the choices."""
        if not self.operating_points:
            if name is not None:
                raise ValueError(
                    f"this router has a single head and no operating points; drop operating_point={name!r}."
                )
            return None
        name = self.operating_point if name is None else name
        if not isinstance(name, str) or name not in self.operating_points:
            raise ValueError(
                f"operating_point {name!r} is not one of this router's: {', '.join(sorted(self.operating_points))}."
            )
        return name

    def canonical_query(self, text: str) -> str:
        """The text the router embeds for `text` (see `query_format`)."""
        return canonical_query(text, self.query_format)

    def fallback_agent(self, operating_point: str | None = None) -> str | None:
        """The agent that answers flagged queries at `operating_point` (its own `ood_fallback_agent`,
        else the router's)."""
        name = self.check_operating_point(operating_point)
        settings = self.operating_points[name] if name is not None else {}
        return settings.get("ood_fallback_agent") or self.ood_fallback_agent

    @property
    def costs_per_1k(self) -> list[float]:
        """Each agent's expected cost per 1,000 queries (`agent_costs_per_1k`; else 1,000: one unit a call)."""
        return self.agent_costs_per_1k or [1000.0] * len(self.id2label)

    @property
    def calibration_shapes(self) -> dict[str, tuple[int, ...]]:
        """{name: shape} of the calibration tensors model.safetensors holds as `tradeoff.<name>` ({} when the
        config holds the values itself, or there is no calibration)."""
        record = self.tradeoff_calibration or {}
        if "margins" in record or "levels" not in record:
            return {}
        lambdas = (record["lambdas"],)
        return {"margins": (len(self.id2label), record["levels"]), "lambdas": lambdas, "cost_per_1k": lambdas}

    def check_tradeoff(self, tradeoff: str | None) -> None:
        """A ValueError (naming the valid forms) unless this router can decide under `tradeoff` (None: its
        default): a probability head, the spelling, and a calibration for the budget forms. The config alone
        tells, before any weights load."""
        if self.head_kind != "probability":
            self.tradeoff_rule(tradeoff)  # the argmax, or the error saying operating points are the trade-offs
            return
        form, _, _ = parse_tradeoff(self.default_tradeoff(tradeoff), self.agent_order, self.costs_per_1k)
        if form in ("budget", "usd-per-1k") and not self.tradeoff_calibration:
            raise ValueError(f"{form}= needs a calibrated router (config.tradeoff_calibration); recalibrate it first.")

    def tradeoff_rule(self, tradeoff: str | None, calibration: dict[str, Any] | None = None) -> tuple[str, float, int]:
        """The rule `decide` applies for `tradeoff` (None: the config's `tradeoff`, else DEFAULT_TRADEOFF), a
        budget resolved through `calibration` (RouterModel.calibration_values, from model.safetensors; by
        default the values a config holds itself); a ValueError for a CMA-ES head or a bad spelling."""
        tradeoff = tradeoff or self.tradeoff
        if self.head_kind != "probability":
            if tradeoff is None:
                return ("argmax", 0.0, -1)
            raise ValueError(
                f"tradeoff={tradeoff!r} needs a probability head; this router's head is CMA-ES (head_kind "
                "'cmaes'), whose trade-offs are its operating points: pass operating_point=... instead."
            )
        if calibration is None and "margins" in (self.tradeoff_calibration or {}):
            calibration = self.tradeoff_calibration
        form, value, agent = parse_tradeoff(self.default_tradeoff(tradeoff), self.agent_order, self.costs_per_1k)
        return resolve_tradeoff(form, value, agent, calibration, self.agent_order[agent])

    def default_tradeoff(self, tradeoff: str | None = None) -> str:
        """The rule a query is decided by: its own, else the config's `tradeoff`, else DEFAULT_TRADEOFF."""
        return tradeoff or self.tradeoff or DEFAULT_TRADEOFF

    def check_settings(self) -> None:
        """The choices a config alone can refuse, before any weights load: the operating point and, for a
        probability head, the default trade-off, the pooling (each a ValueError naming the valid forms)."""
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling {self.pooling!r} is not one of {', '.join(POOLINGS)}.")
        k, rows = self.neighbour_outcomes, self.neighbour_rows
        if not isinstance(k, int) or isinstance(k, bool) or not (k == 0 or 0 < k <= rows):
            raise ValueError(
                f"neighbour_outcomes must be 0 (none) or a whole number of neighbours up to the {rows} stored "
                f"training queries (neighbour_rows), got {k!r}."
            )
        self.check_operating_point(self.operating_point)
        if self.tradeoff is not None:
            self.check_tradeoff(self.tradeoff)

    @property
    def has_ood_guard(self) -> bool:
        """Whether the checkpoint carries an out-of-distribution guard (whether or not it is switched on)."""
        return self.ood_threshold is not None

    @property
    def embedding_dim(self) -> int:
        """Size of the pooled embedding: the backbone's hidden size, times its hidden states with every-layer."""
        if self.pooling == "every-layer":
            return self.text_config.hidden_size * (self.text_config.num_hidden_layers + 1)
        return self.text_config.hidden_size

    @property
    def head_input_dim(self) -> int:
        """What the head reads: the embedding, and with neighbour outcomes one number per agent beside it."""
        return self.embedding_dim + (len(self.id2label) if self.neighbour_outcomes else 0)


def rope_for_this_version(text_config: dict[str, Any]) -> dict[str, Any]:
    """A backbone config as this transformers reads it. transformers 5 writes a RoPE model's settings as
    `rope_parameters`; 4.x reads `rope_theta` and `rope_scaling`, and without them would run a router exported
    on 5 with its own default theta (Qwen3's 1e6 became 1e4)."""
    rope = text_config.get("rope_parameters")
    if int(transformers_version.split(".")[0]) >= 5 or not isinstance(rope, dict) or "rope_theta" in text_config:
        return text_config
    scaling = {key: value for key, value in rope.items() if key != "rope_theta"}
    if scaling.get("rope_type", "default") != "default":
        text_config.setdefault("rope_scaling", scaling)
    if "rope_theta" in rope:
        text_config["rope_theta"] = rope["rope_theta"]
    return text_config


def parse_tradeoff(text: str, agents: list[str], costs_per_1k: list[float]) -> tuple[str, float, int]:
    """(form, value, agent index) of a trade-off spelled `tolerance=T`, `lambda=L`, `budget=X`,
    `budget=X@AGENT` or `usd-per-1k=Y`; a budget's agent defaults to the most expensive (the first of
    equals). Anything else is one ValueError naming the valid forms."""
    form, _, rest = str(text).strip().partition("=")
    number, _, agent_name = rest.partition("@") if form == "budget" else (rest, "", "")
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    limits = {"tolerance": (0.0, 1.0), "lambda": (0.0, math.inf), "budget": (0.0, 1.0), "usd-per-1k": (0.0, math.inf)}
    low, high = limits.get(form, (math.nan, math.nan))
    if not low <= value <= high or math.isinf(value) or (agent_name and agent_name not in agents):
        raise ValueError(f"bad tradeoff {text!r}: use one of {TRADEOFF_FORMS}, AGENT one of {', '.join(agents)}.")
    agent = (
        agents.index(agent_name) if agent_name else max(range(len(costs_per_1k)), key=lambda i: (costs_per_1k[i], -i))
    )
    return form, value, agent


def resolve_tradeoff(
    form: str, value: float, agent: int, calibration: dict[str, Any] | None, agent_name: str
) -> tuple[str, float, int]:
    """The primitive rule of a parsed trade-off: ("tolerance", T, -1), ("lambda", L, -1), or for
    `budget=X` ("penalty", mu, agent): mu is subtracted from the agent's probability, set so that on the
    calibration sample at most X of the queries go to it (the (1 - X) quantile of its margin over the
    best other agent, as RouteLLM's calibrate_threshold; 0 when it gets no more than X unpenalised).
    `usd-per-1k=Y` is the `lambda` rule at the smallest grid lambda whose sample cost is at most Y."""
    if form in ("tolerance", "lambda"):
        return form, value, -1
    if not calibration:
        raise ValueError(f"{form}= needs a calibrated router (config.tradeoff_calibration); recalibrate it first.")
    if form == "usd-per-1k":
        lambdas, costs = calibration["lambdas"], calibration["cost_per_1k"]
        return "lambda", next((lam for lam, cost in zip(lambdas, costs, strict=True) if cost <= value), lambdas[-1]), -1
    if value == 0:
        return "penalty", math.inf, agent
    margins = calibration["margins"][agent_name]
    position = (1 - value) * (len(margins) - 1)  # margins are quantiles at evenly spaced levels 0..1
    low = min(int(position), len(margins) - 2)
    threshold = margins[low] + (position - low) * (margins[low + 1] - margins[low])
    return "penalty", max(0.0, threshold), agent


def canonical_query(text: str, rules: dict[str, list[str]] | None) -> str:
    """`text` without the paragraphs that are known answer-format instructions and without a known
    leading label; `text` unchanged when there are no rules or nothing would be left."""
    if not rules:
        return text
    instructions = set(rules.get("instructions", ()))
    kept = "\n\n".join(part for part in text.split("\n\n") if part.strip() not in instructions).strip()
    for label in rules.get("labels", ()):
        if kept.startswith(label):
            kept = kept[len(label) :].lstrip()
            break
    return kept or text

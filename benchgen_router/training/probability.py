"""The probability head: for each agent, the calibrated probability that it answers a query correctly.

    head = fit_probability_head(embeddings, correct)          # (n, D) float32, (n, N) in [0, 1]
    probabilities = head.predict(embeddings)                   # (n, N)
    picks = decide(probabilities, costs_per_1k, "budget=0.3")  # tradeoffs.decide: the rule of docs/tradeoff.md

One logistic regression per agent over the same pooled embedding as the CMA-ES head (a linear layer and
a sigmoid, so it travels in the same checkpoint), L2-regularised with a strength chosen per agent by
inner cross-validation on held-out log loss. Rewards in [0, 1] are soft labels. The decision rule itself
is the model code's (`RouterConfig.tradeoff_rule` and `decide` in modeling_router.py), applied to numpy
arrays by `benchgen_router.tradeoffs`, so a benchmark, the trainer and the router pick alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchgen_router.hardware import one_thread
from benchgen_router.tradeoffs import decide, tradeoff_calibration

# L2 strengths tried per agent (on standardised features, loss averaged over rows), strongest first so
# that a tie in held-out log loss keeps the simpler model.
STRENGTHS = (1.0, 0.1, 0.01, 1e-3, 1e-4)
INNER_FOLDS = 3
CALIBRATION_BINS = 10


@dataclass
class ProbabilityHead:
    """`weight` (N, D) and `bias` (N,) of the linear layer whose sigmoid is each agent's probability of
    answering correctly; `strengths` (N,) the L2 strength inner cross-validation chose per agent."""

    weight: np.ndarray
    bias: np.ndarray
    strengths: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def predict(self, embeddings: np.ndarray) -> np.ndarray:
        """(n, D) embeddings -> (n, N) probabilities (float64)."""
        logits = np.asarray(embeddings, dtype=np.float64) @ self.weight.astype(np.float64).T + self.bias
        return 1.0 / (1.0 + np.exp(-logits))

    def theta(self) -> np.ndarray:
        """The flat vector of head_weights.npy (the reference's layout: W (D, N) row-major, then b)."""
        return np.concatenate([self.weight.T.astype(np.float64).ravel(), self.bias.astype(np.float64)])


def fit_probability_head(
    embeddings: np.ndarray, correct: np.ndarray, seed: int = 0, strengths: tuple[float, ...] = STRENGTHS
) -> ProbabilityHead:
    """Fit one L2-regularised logistic regression per agent: `embeddings` (n, D), `correct` (n, N) in
    [0, 1] (soft labels for graded rewards). Each agent's strength is the one of `strengths` with the
    lowest mean held-out log loss over INNER_FOLDS seeded folds, the strengths tried strongest first until one
    improves no agent's held-out loss; the final fit uses every row."""
    import torch

    x = np.asarray(embeddings, dtype=np.float64)
    y = np.asarray(correct, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2 or len(x) != len(y) or len(x) < 2:
        raise ValueError(f"embeddings (n, D) and correct (n, N) must share n >= 2 rows, got {x.shape} and {y.shape}.")
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or y.min() < 0 or y.max() > 1:
        raise ValueError("embeddings must be finite and correct must lie in [0, 1].")
    # Standardised features condition the search; the scaling is folded back into the layer afterwards.
    mean, scale = feature_scaling(x)
    z = torch.from_numpy((x - mean) / scale)
    targets = torch.from_numpy(y)
    folds = np.random.default_rng(seed).permutation(len(x)) % min(INNER_FOLDS, len(x))
    with one_thread():
        return _fit_with_inner_cv(z, targets, folds, strengths, mean, scale)


def feature_scaling(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, scale) of each feature over the rows: the head is fitted on (x - mean) / scale; a constant
    feature keeps scale 1."""
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-12] = 1.0
    return mean, scale


def _fit_with_inner_cv(
    z: Any, targets: Any, folds: np.ndarray, strengths: tuple[float, ...], mean: np.ndarray, scale: np.ndarray
) -> ProbabilityHead:
    import torch

    y = targets.numpy()
    losses = np.full((len(strengths), y.shape[1]), np.inf)
    splits = [(torch.from_numpy(folds != fold), torch.from_numpy(folds == fold)) for fold in np.unique(folds)]
    starts: list[Any] = [None] * len(splits)  # each strength starts from the stronger one's solution: fewer steps
    for k, strength in enumerate(strengths):
        losses[k] = 0.0
        for i, (train, held) in enumerate(splits):
            starts[i] = _fit(
                z[train], targets[train], torch.full((y.shape[1],), strength, dtype=torch.float64), starts[i]
            )
            logits = z[held] @ starts[i][0].T + starts[i][1]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets[held], reduction="none")
            losses[k] += loss.sum(dim=0).numpy() / len(y)
        # Held-out loss along the path rises once the penalty is too weak to curb overfitting: when no agent
        # is better at this strength than at a stronger one, weaker ones (the slowest fits) are not tried.
        if k and (losses[k] >= losses[:k].min(axis=0)).all():
            break
    chosen = np.array([strengths[k] for k in losses.argmin(axis=0)])
    weight, bias = _fit(z, targets, torch.from_numpy(chosen))
    weight, bias = weight.numpy() / scale, bias.numpy() - (weight.numpy() / scale) @ mean
    return ProbabilityHead(weight.astype(np.float32), bias.astype(np.float32), chosen)


def _fit(z: Any, targets: Any, strengths: Any, start: tuple[Any, Any] | None = None) -> tuple[Any, Any]:
    """Minimise, for every agent at once (the loss is a sum over agents), the mean binary cross-entropy
    plus strength/2 * |w|^2 (the bias unpenalised) with L-BFGS from `start` (else zeros); float64, deterministic."""
    import torch

    if start is None:
        start = (torch.zeros(targets.shape[1], z.shape[1], dtype=torch.float64), torch.zeros(targets.shape[1]))
    weight = start[0].clone().to(torch.float64).requires_grad_(True)
    bias = start[1].clone().to(torch.float64).requires_grad_(True)
    optimiser = torch.optim.LBFGS(
        [weight, bias], max_iter=300, history_size=20, tolerance_grad=1e-6, line_search_fn="strong_wolfe"
    )

    def closure() -> Any:
        optimiser.zero_grad()
        logits = z @ weight.T + bias
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="none").mean(dim=0)
        loss = (loss + 0.5 * strengths * (weight**2).sum(dim=1)).sum()
        loss.backward()
        return loss

    optimiser.step(closure)
    return weight.detach(), bias.detach()


def calibration_report(probabilities: np.ndarray, correct: np.ndarray, agents: list[str], bins: int = CALIBRATION_BINS):
    """How well predicted probabilities match outcomes on held-out rows: per agent and pooled, the
    Brier score (mean squared error), the expected calibration error (ECE: the row-weighted mean gap
    between predicted and observed rates over `bins` equal-width bins) and the reliability table
    (per bin: rows, mean predicted, observed rate)."""
    p = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(correct, dtype=np.float64)

    def summary(pred: np.ndarray, outcome: np.ndarray) -> dict[str, Any]:
        index = np.minimum((pred * bins).astype(int), bins - 1)
        table, ece = [], 0.0
        for b in range(bins):
            rows = index == b
            if rows.any():
                predicted, observed = float(pred[rows].mean()), float(outcome[rows].mean())
                ece += rows.sum() / len(pred) * abs(predicted - observed)
                table.append(
                    {
                        "bin": [b / bins, (b + 1) / bins],
                        "rows": int(rows.sum()),
                        "predicted": predicted,
                        "observed": observed,
                    }
                )
        return {"brier": float(((pred - outcome) ** 2).mean()), "ece": float(ece), "reliability": table}

    report = {"rows": len(p), "pooled": summary(p.ravel(), y.ravel())}
    report["agents"] = {agent: summary(p[:, j], y[:, j]) for j, agent in enumerate(agents)}
    return report


def expected_costs_per_1k(cost_per_1k: np.ndarray | None, agents: int) -> list[float]:
    """Each agent's mean cost per 1,000 queries over the training rows (USD, from --calls/--pool), or
    1,000 (one unit a call) when the run has no per-call costs."""
    if cost_per_1k is None:
        return [1000.0] * agents
    return [float(v) for v in np.asarray(cost_per_1k, dtype=np.float64).mean(axis=0)]


def reliability_lines(report: dict[str, Any]) -> list[str]:
    """The pooled reliability table as text lines, for the training log."""
    lines = [f"{'bin':>11}  {'rows':>6}  {'predicted':>9}  {'observed':>8}"]
    for row in report["pooled"]["reliability"]:
        low, high = row["bin"]
        lines.append(f"{low:.1f}-{high:.1f}  {row['rows']:>6}  {row['predicted']:>9.3f}  {row['observed']:>8.3f}")
    return lines


def train_probability(config: Any) -> Any:
    """`benchgen-router train --head-kind probability`: embed the labelled prompts, fit the probability head
    on the training rows, calibrate the budget rules on them, measure calibration (Brier, ECE, reliability)
    and the default rule's picks on the held-out rows, and write the run folder (and with `export`, the
    Hub folder) in the same formats as a CMA-ES run. Rewards (in [0, 1]) are the labels; costs come from
    --calls/--pool, else one unit a call. No guard or operating points: the trade-off is chosen per request.
    With `finetune`, the backbone trains with the head (training/finetune.py)."""
    import time

    if config.finetune:
        from benchgen_router.training.finetune import train_finetuned

        return train_finetuned(config)

    from benchgen_router.forms import QUERY_FORMATS
    from benchgen_router.model_code import canonical_query
    from benchgen_router.release.folder import check_output_folder
    from benchgen_router.training.config import check_config
    from benchgen_router.training.run import TrainResult, backbone_embedder, export_router, read_training_data

    check_config(config)
    if config.export is not None:
        check_output_folder(config.export, overwrite=False)
    data, _, test, how, cost_data = read_training_data(config)
    rewards = np.asarray(data.rewards, dtype=np.float64)  # in [0, 1]: the data's reader checks
    k, rows = config.neighbour_outcomes, int((~test).sum())
    if k and k >= rows:  # before the embedding pass
        from benchgen_router.errors import setting_error

        raise setting_error(f"{{neighbour_outcomes}} {k} must be below the {rows} training rows.")
    rules = QUERY_FORMATS[config.query_format]
    started = time.perf_counter()
    embedded = backbone_embedder(config, data.agents)([canonical_query(p, rules) for p in data.prompts])
    timings = {"embedding_seconds": time.perf_counter() - started}
    embeddings = embedded.vectors.astype(np.float32)
    started = time.perf_counter()
    inputs = head_inputs(embeddings, rewards, test, k)
    head = fit_probability_head(inputs[~test], rewards[~test], seed=config.seed)
    timings["fit_seconds"] = time.perf_counter() - started
    neighbours = None
    if k:  # what the router keeps to find them: the training rows' unit embeddings and their rewards
        unit = embeddings[~test] / np.maximum(np.linalg.norm(embeddings[~test], axis=1, keepdims=True), 1e-12)
        neighbours = (k, unit.astype(np.float32), rewards[~test].astype(np.float32))
    fitted = FittedRun(data, test, how, cost_data, head, inputs, embedded.truncation_length, timings, neighbours)
    report, manifest, release = write_probability_run(config, fitted)
    if config.export is not None:
        export_router(config, release)
    return TrainResult(report=report, manifest=manifest, head=head)


def head_inputs(embeddings: np.ndarray, rewards: np.ndarray, test: np.ndarray, k: int) -> np.ndarray:
    """What the head reads for every row: the embedding, and with `k` neighbour outcomes, each agent's among the
    k nearest training rows beside it (leave-one-out for the training rows: training/neighbours.py)."""
    if not k:
        return embeddings
    from benchgen_router.training.neighbours import with_neighbour_outcomes

    inputs = np.zeros((len(embeddings), embeddings.shape[1] + rewards.shape[1]), dtype=np.float32)
    inputs[~test], inputs[test] = with_neighbour_outcomes(embeddings[~test], rewards[~test], embeddings[test], k)
    return inputs


@dataclass
class FittedRun:
    """What a probability run fitted, for its outputs: the labelled data, the held-out mask and how it was
    chosen, the per-call costs (or None), the head, every row's embedding, the truncation and the timings."""

    data: Any
    test: np.ndarray
    how: str
    cost_data: Any
    head: ProbabilityHead
    embeddings: np.ndarray
    truncation_length: int
    timings: dict[str, float]
    # with neighbour outcomes: (k, the training rows' unit embeddings, their rewards), which the router keeps
    neighbours: tuple[int, np.ndarray, np.ndarray] | None = None


def write_probability_run(config: Any, fitted: FittedRun, extra: dict[str, Any] | None = None) -> tuple[Any, Any, Any]:
    """Calibrate the budget rules on the training rows, report, and write the run folder: (report, manifest,
    the Release an export writes). `extra` records go into the report and the manifest alike."""
    from benchgen_router.forms import QUERY_FORMATS
    from benchgen_router.manifest import make_manifest
    from benchgen_router.release.convert import Release
    from benchgen_router.training.run import write_run

    data, test, head, embeddings = fitted.data, fitted.test, fitted.head, fitted.embeddings
    rules = QUERY_FORMATS[config.query_format]
    costs = expected_costs_per_1k(
        None if fitted.cost_data is None else fitted.cost_data.cost_per_1k[~test], len(data.agents)
    )
    calibration = tradeoff_calibration(head.predict(embeddings[~test]), np.asarray(costs), data.agents)
    report = probability_report(
        config, data, test, fitted.how, head, embeddings, costs, fitted.truncation_length, fitted.timings
    )
    report.extra.update(extra or {})
    settings = {"head_kind": "probability", "agent_costs_per_1k": costs, "tradeoff_calibration": calibration}
    records = {"probability_head": report.extra["probability_head"], **(extra or {})}
    pooling = config.pooling
    k = fitted.neighbours[0] if fitted.neighbours else 0
    manifest = make_manifest(
        agent_order=data.agents,
        embedding_dim=int(embeddings.shape[1]),  # the head's inputs, as the reference's layout reads them
        head_hidden_dim=0,
        **({"query_format": rules} if rules else {}),
        **({"pooling": pooling} if pooling != "last-layer" else {}),
        **({"neighbour_outcomes": k} if k else {}),
        **{key: value for key, value in report.to_dict().items() if key not in records},
    )
    manifest.update(settings, **records)
    write_run(config.output_dir, manifest, head.theta())
    release = Release(
        agents=data.agents,
        embedding_dim=int(embeddings.shape[1]) - (len(data.agents) if k else 0),  # the pooled embedding
        head_hidden_dim=0,
        head=head.theta(),
        report=report,
        truncation_length=fitted.truncation_length,
        query_format=rules or None,
        pooling=pooling,
        neighbours=fitted.neighbours,
        **settings,
    )
    return report, manifest, release


def probability_report(
    config: Any,
    data: Any,
    test: np.ndarray,
    how: str,
    head: ProbabilityHead,
    embeddings: np.ndarray,
    costs: list[float],
    truncation_length: int,
    timings: dict[str, float],
) -> Any:
    """The run's TrainingReport: the default rule's picks scored on the training and held-out rows, the
    baselines, and the head's calibration on the held-out rows."""
    from benchgen_router.evaluation.metrics import evaluate_picks
    from benchgen_router.model_code import DEFAULT_TRADEOFF
    from benchgen_router.release.report import TrainingReport
    from benchgen_router.training.config import rewards_source
    from benchgen_router.training.run import model_id

    rewards = np.asarray(data.rewards, dtype=np.float64)
    train_picks = decide(head.predict(embeddings[~test]), costs, DEFAULT_TRADEOFF)
    held_out = head.predict(embeddings[test])
    evaluation = evaluate_picks(decide(held_out, costs, DEFAULT_TRADEOFF), rewards[test], data.agents)
    theta = head.theta()
    return TrainingReport(
        model_id=config.model_id or model_id(config.backbone_id, data.agents, theta),
        backbone_model=config.backbone_id,
        backbone_revision=config.backbone_revision,
        rewards_dataset=rewards_source(config),
        n_head_params=int(theta.size),
        n_total=len(data),
        n_train=int((~test).sum()),
        n_test=int(test.sum()),
        held_out=how,
        train_reward=float(rewards[~test][np.arange(len(train_picks)), train_picks].mean()),
        test_reward=evaluation["router"],
        baselines={key: evaluation[key] for key in ("random_agent", "best_fixed_agent", "oracle")},
        beats_best_fixed_agent=evaluation["beats_best_fixed_agent"],
        duration_seconds=round(sum(timings.values()), 3),
        truncation_length=truncation_length,
        evaluation=evaluation,
        timings={key: round(value, 3) for key, value in timings.items()},
        extra={
            "probability_head": {
                "method": "logistic regression per agent, L2 strength by inner cross-validation",
                "strengths": dict(zip(data.agents, head.strengths.tolist(), strict=True)),
                "inner_folds": INNER_FOLDS,
                "default_tradeoff": DEFAULT_TRADEOFF,
                "held_out_calibration": calibration_report(held_out, rewards[test], data.agents),
            }
        },
    )


def probability_summary(report: Any) -> str:
    """What `train --head-kind probability` prints: the held-out evaluation under the default rule, and
    the held-out calibration (Brier score, ECE, pooled reliability table)."""
    from benchgen_router.evaluation.metrics import format_evaluation

    record = report.extra["probability_head"]
    calibration = record["held_out_calibration"]
    pooled = calibration["pooled"]
    lines = [
        format_evaluation(report.evaluation, f"held-out evaluation ({record['default_tradeoff']})"),
        f"held-out calibration ({calibration['rows']} rows): Brier {pooled['brier']:.4f}, ECE {pooled['ece']:.4f}; "
        + ", ".join(f"{agent} Brier {row['brier']:.4f}" for agent, row in calibration["agents"].items()),
        *reliability_lines(calibration),
    ]
    if "finetune" in report.extra:
        from benchgen_router.training.finetune import finetune_summary

        lines.append(finetune_summary(report.extra["finetune"]))
    return "\n".join(lines)

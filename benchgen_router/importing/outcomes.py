"""The matrix every reader returns: which agent answered which task correctly, and what each call cost."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np


@dataclass
class Outcomes:
    """Labelled outcomes: row i is task_ids[i] (prompts[i], groups[i]); column j is agents[j].

    `rewards[i, j]` is 1.0 when agent j answered task i correctly, else 0.0. The per-call arrays have
    the same shape and hold NaN where the source does not say: cost in USD (or 1 per call, see
    `cost_unit`), latency in milliseconds, token counts."""

    task_ids: list[str]
    prompts: list[str]
    groups: list[str | None]
    agents: list[str]
    rewards: np.ndarray  # (n, agents) float64, 0.0 or 1.0
    cost_usd: np.ndarray  # (n, agents) float64, NaN where unknown
    latency_ms: np.ndarray  # (n, agents) float64, NaN where unknown
    prompt_tokens: np.ndarray  # (n, agents) float64 (whole numbers), NaN where unknown
    completion_tokens: np.ndarray  # (n, agents) float64 (whole numbers), NaN where unknown
    responses: list[list[str | None]] | None = None  # [task][agent] answer text, when the source has it
    sources: list[str] = field(default_factory=list)  # "<file>:<line>" of each task's first row
    dataset: str | None = None
    dropped_contaminated: int = 0  # rows dropped because their prompt is on a contamination list
    dropped_incomplete: int = 0  # tasks dropped for a missing (task, model) cell (drop_incomplete)
    cost_unit: str = "usd"  # "usd", or "calls": a count of calls (1 per call, or a fixed cost per call in calls)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.task_ids)

    def head(self, count: int) -> Outcomes:
        """The first `count` tasks (a small slice to try things on)."""
        keep = slice(0, count)
        return replace(
            self,
            task_ids=self.task_ids[keep],
            prompts=self.prompts[keep],
            groups=self.groups[keep],
            rewards=self.rewards[keep],
            cost_usd=self.cost_usd[keep],
            latency_ms=self.latency_ms[keep],
            prompt_tokens=self.prompt_tokens[keep],
            completion_tokens=self.completion_tokens[keep],
            responses=None if self.responses is None else self.responses[keep],
            sources=self.sources[keep],
            notes=list(self.notes),
        )

"""An independent, literal implementation of docs/reference.md, for parity tests.

Written from the reference text alone (plain AutoTokenizer/AutoModel, numpy head); it shares no
code with the package, so agreement means the package reproduces the reference.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer


class ReferenceRouter:
    def __init__(self, backbone_dir: str, theta: np.ndarray, agent_order: list[str], head_hidden_dim: int = 0):
        self.tok = AutoTokenizer.from_pretrained(backbone_dir)
        self.model = AutoModel.from_pretrained(backbone_dir, dtype=torch.float32)
        self.model.eval()
        self.theta = np.asarray(theta, dtype=np.float64)
        self.agent_order = agent_order
        self.head_hidden_dim = head_hidden_dim

    @torch.no_grad()
    def embed(self, texts: list[str]) -> np.ndarray:
        enc = self.tok(texts, padding=True, truncation=True, max_length=1024, return_tensors="pt")
        h = self.model(**enc).last_hidden_state
        m = enc["attention_mask"][..., None].float()
        emb = (h * m).sum(1) / m.sum(1).clamp(min=1e-6)
        return emb.numpy()

    def logits(self, emb: np.ndarray) -> np.ndarray:
        D, N, H = emb.shape[1], len(self.agent_order), self.head_hidden_dim
        t = self.theta
        if H == 0:
            W = t[: D * N].reshape(D, N)
            b = t[D * N :]
            return emb @ W + b
        W1 = t[: D * H].reshape(D, H)
        b1 = t[D * H : D * H + H]
        W2 = t[D * H + H : D * H + H + H * N].reshape(H, N)
        b2 = t[D * H + H + H * N :]
        return np.tanh(emb @ W1 + b1) @ W2 + b2

    def pick_agent(self, query: str) -> dict:
        logits = self.logits(self.embed([query]))[0]
        return {"picked_agent": self.agent_order[int(np.argmax(logits))], "logits": logits}

    def batch_logits(self, texts: list[str], batch_size: int = 16) -> np.ndarray:
        out = [self.logits(self.embed(texts[i : i + batch_size])) for i in range(0, len(texts), batch_size)]
        return np.concatenate(out)

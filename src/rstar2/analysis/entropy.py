"""Token entropy of trajectories, as the rStar2-Agent report reads it (Fig. 10–11): which model tokens
are high-entropy, and in which class. The mask and the summary take plain lists: testable by hand."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..chat.token_classes import CLASSES
from ..config import DEFAULT_ROLLOUT


def entropy_of_logits(logits: Any, temperature: float = DEFAULT_ROLLOUT.temperature) -> Any:
    """Shannon entropy (nats) of softmax(logits / T) over the last axis, computed stably."""
    import torch

    logp = torch.log_softmax(logits.float() / max(temperature, 1e-6), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def top_share_mask(values: Sequence[float], share: float) -> list[bool]:
    """The ``share`` highest values (at least one when any), ties broken by position."""
    if not 0 < share <= 1:
        raise ValueError(f"--top must be in (0, 1], got {share}")
    k = max(1, round(share * len(values)))
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    chosen = set(order[:k])
    return [i in chosen for i in range(len(values))]


@dataclass
class TrajectoryEntropy:
    """One trajectory's response tokens, entropies (None on tool tokens), classes and high marks."""

    pieces: list[str]
    entropy: list[float | None]
    classes: list[str | None]
    high: list[bool]
    reward: float = 0.0
    problem: str = ""


def mark_high(entropy: Sequence[float | None], share: float) -> list[bool]:
    """Top ``share`` of this trajectory's model tokens by entropy (tool tokens never)."""
    idx = [i for i, e in enumerate(entropy) if e is not None]
    top = top_share_mask([entropy[i] for i in idx], share) if idx else []
    high = [False] * len(entropy)
    for i, h in zip(idx, top, strict=True):
        high[i] = h
    return high


@dataclass
class Summary:
    tokens: dict[str, int] = field(default_factory=dict)  # model tokens per class
    high: dict[str, int] = field(default_factory=dict)  # high-entropy tokens per class
    mean_entropy: dict[str, float] = field(default_factory=dict)
    top_tokens: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    by_position: list[float] = field(default_factory=list)  # mean entropy in relative-position bins

    @property
    def high_total(self) -> int:
        return sum(self.high.values())

    def lines(self) -> list[str]:
        return [
            f"{r['class']:>10}: {r['tokens']:>7} tokens, {r['high_share_in_class']:6.1%} high-entropy, "
            f"{r['share_of_high']:6.1%} of all high"
            for r in self.rows()
        ]

    def rows(self) -> list[dict[str, Any]]:
        """Per class: its tokens, the share of them that are high-entropy, its share of all high ones."""
        total = max(1, self.high_total)
        return [
            {
                "class": c,
                "tokens": self.tokens.get(c, 0),
                "high": self.high.get(c, 0),
                "high_share_in_class": self.high.get(c, 0) / self.tokens[c] if self.tokens.get(c) else 0.0,
                "share_of_high": self.high.get(c, 0) / total,
                "mean_entropy": self.mean_entropy.get(c, 0.0),
            }
            for c in CLASSES
        ]


def summarize(items: Sequence[TrajectoryEntropy], bins: int = 20, top_k: int = 10) -> Summary:
    s = Summary()
    sums: Counter[str] = Counter()
    counters: dict[str, Counter[str]] = {c: Counter() for c in CLASSES}
    pos_sum, pos_n = [0.0] * bins, [0] * bins
    for it in items:
        model = [i for i, c in enumerate(it.classes) if c is not None]
        for rank, i in enumerate(model):
            c, e = it.classes[i], it.entropy[i]
            assert c is not None and e is not None
            s.tokens[c] = s.tokens.get(c, 0) + 1
            sums[c] += e
            if it.high[i]:
                s.high[c] = s.high.get(c, 0) + 1
                counters[c][it.pieces[i].strip() or repr(it.pieces[i])] += 1
            b = min(bins - 1, int(bins * rank / max(1, len(model))))
            pos_sum[b] += e
            pos_n[b] += 1
    s.mean_entropy = {c: sums[c] / s.tokens[c] for c in s.tokens}
    s.top_tokens = {c: counters[c].most_common(top_k) for c in CLASSES}
    s.by_position = [pos_sum[b] / pos_n[b] if pos_n[b] else math.nan for b in range(bins)]
    return s


def teacher_forced_entropy(
    model: Any,
    prompt_ids: list[int],
    response_ids: list[int],
    temperature: float = DEFAULT_ROLLOUT.temperature,
) -> list[float]:
    """Entropy of the distribution each response token was drawn from (one forward pass)."""
    import torch

    ids = torch.tensor([prompt_ids + response_ids], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
    return entropy_of_logits(logits, temperature).tolist()

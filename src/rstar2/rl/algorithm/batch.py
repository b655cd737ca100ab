"""Trajectories → right-padded training tensors (position t predicts token t+1: shifted here, once),
and micro-batches of rows of similar length; their token weights were computed for the whole
batch, so the split never changes the gradient."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from .grpo import Aggregation, token_weights


@dataclass
class Batch:
    input_ids: torch.Tensor  # (rows, T) long
    attention_mask: torch.Tensor  # (rows, T) long
    labels: torch.Tensor  # (rows, T-1) long
    mask: torch.Tensor  # (rows, T-1) float: 1 = a model token to learn
    advantages: torch.Tensor  # (rows, T-1) float, the row's advantage on every position
    engine_logp: torch.Tensor  # (rows, T-1) float, the engine's logprobs of sampled tokens
    group_index: torch.Tensor  # (rows,) long
    weights: torch.Tensor | None = None  # (rows, T-1) float, see grpo.token_weights
    old_logp: torch.Tensor | None = None  # (rows, T-1) float, set by the trainer
    ref_logp: torch.Tensor | None = None  # (rows, T-1) float, the reference policy's (KL only)
    token_class: torch.Tensor | None = None  # (rows, T-1) long, analysis.entropy class, -1 = none

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> Batch:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return Batch(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()})

    def select(self, rows: Sequence[int], width: int | None = None) -> Batch:
        """These rows, cut to ``width`` positions (their longest sequence)."""
        idx = torch.as_tensor(list(rows), dtype=torch.long)
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                v = v[idx]
                if width is not None and v.dim() == 2:
                    v = v[:, : width if f.name in ("input_ids", "attention_mask") else width - 1]
            out[f.name] = v
        return Batch(**out)


def collate(
    sequences: Sequence[tuple[list[int], list[int], list[int], list[float]]],
    advantages: Sequence[float],
    group_index: Sequence[int],
    pad_id: int = 0,
    classes: Sequence[Sequence[int]] | None = None,
) -> Batch:
    """Rows of (prompt_ids, response_ids, loss_mask, engine_logprobs); ``classes``: per response token."""
    if not sequences:
        raise ValueError("cannot build a training batch from zero trajectories")
    width = max(len(p) + len(r) for p, r, _, _ in sequences)
    rows = len(sequences)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    mask = torch.zeros((rows, width - 1))
    engine = torch.zeros((rows, width - 1))
    token_class = torch.full((rows, width - 1), -1, dtype=torch.long) if classes is not None else None
    for i, (prompt, response, loss_mask, logprobs) in enumerate(sequences):
        if not (len(response) == len(loss_mask) == len(logprobs)):
            raise ValueError(
                f"row {i}: response ids ({len(response)}), loss mask ({len(loss_mask)}) and "
                f"logprobs ({len(logprobs)}) must have the same length"
            )
        n, start = len(prompt) + len(response), len(prompt) - 1
        input_ids[i, :n] = torch.tensor(prompt + response, dtype=torch.long)
        attention[i, :n] = 1
        if response:
            mask[i, start : start + len(response)] = torch.tensor(loss_mask, dtype=torch.float32)
            engine[i, start : start + len(response)] = torch.tensor(logprobs, dtype=torch.float32)
            if token_class is not None:
                token_class[i, start : start + len(response)] = torch.tensor(classes[i], dtype=torch.long)
    adv = torch.tensor(list(advantages), dtype=torch.float32)[:, None].expand(rows, width - 1).clone()
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        labels=input_ids[:, 1:].clone(),
        mask=mask,
        advantages=adv,
        engine_logp=engine,
        group_index=torch.tensor(list(group_index), dtype=torch.long),
        token_class=token_class,
    )


def with_weights(batch: Batch, aggregation: Aggregation, units: float | None = None) -> Batch:
    return replace(batch, weights=token_weights(batch.mask, batch.group_index, aggregation, units))


def plan_micro_batches(batch: Batch, max_tokens: int, count: int | None = None) -> list[list[int]]:
    """Rows of each micro-batch: at most ``max_tokens`` padded tokens (at least one row), similar
    lengths together. ``count``: exactly that many (under FSDP every process runs as many passes):
    the largest split further, empty lists for filler passes."""
    lengths = batch.attention_mask.sum(dim=1).tolist()
    groups: list[list[int]] = []
    current: list[int] = []
    for i in sorted(range(batch.rows), key=lambda i: lengths[i]):
        if current and (len(current) + 1) * max(lengths[i], 2) > max_tokens:
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    while count is not None and len(groups) < count and any(len(g) > 1 for g in groups):
        big = max(range(len(groups)), key=lambda k: len(groups[k]))
        g = groups.pop(big)
        groups[big:big] = [g[: len(g) // 2], g[len(g) // 2 :]]
    return groups + [[] for _ in range(max(0, (count or 0) - len(groups)))]


def take_rows(batch: Batch, rows: list[int]) -> Batch:
    """These rows cut to their longest sequence; an empty list gives a zero-weight filler row."""
    if not rows:
        filler = batch.select([0], 2)
        filler.weights = torch.zeros_like(filler.mask)
        return filler
    width = max(2, int(batch.attention_mask[rows].sum(dim=1).max()))
    return batch.select(rows, width)

"""The model's passes over a batch: log-probs of the labels (with entropies) as trained, and without
gradients for the old policy, the KL reference and the weight-sync probe; micro-batched alike."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..device import compute_precision
from .algorithm.batch import Batch, plan_micro_batches, take_rows
from .algorithm.grpo import token_logprobs
from .run.distributed import LOCAL, World, all_max


def forward_logprobs(
    model: torch.nn.Module,
    mb: Batch,
    with_entropy: bool = False,
    compute: str = "auto",
    *,
    temperature: float,
    banned: Sequence[int] = (),
):
    """Log-probs of the labels, (rows, T-1), and optionally entropies, under the rollouts'
    ``temperature`` and ``banned`` tokens (the distribution the engine sampled from). Logits start at
    the first position any row learns from: a long prompt's head projections are never needed."""
    width = mb.labels.shape[1]
    learn = mb.mask.any(dim=0).nonzero()
    start = int(learn[0]) if len(learn) else width - 1
    with compute_precision(mb.input_ids.device, compute):
        logits = model(
            input_ids=mb.input_ids,
            attention_mask=mb.attention_mask,
            use_cache=False,
            logits_to_keep=width + 1 - start,
        ).logits
    ban = torch.tensor(sorted(set(banned)), dtype=torch.long) if banned else None  # each mass once
    logp, entropy = token_logprobs(
        logits[:, :-1], mb.labels[:, start:], with_entropy, temperature=temperature, banned=ban
    )
    if start:
        pad = logp.new_zeros(logp.shape[0], start)
        logp = torch.cat([pad, logp], dim=1)
        entropy = torch.cat([pad, entropy], dim=1) if entropy is not None else None
    return logp, entropy


def plan(batch: Batch, max_tokens: int, world: World) -> list[list[int]]:
    """Micro-batch rows; under FSDP every process gets as many (each forward is a collective)."""
    rows = plan_micro_batches(batch, max_tokens)
    if world.distributed:
        rows = plan_micro_batches(batch, max_tokens, count=all_max(len(rows), world))
    return rows


@torch.no_grad()
def logprobs_of(
    model: torch.nn.Module,
    batch: Batch,
    max_tokens: int,
    world: World = LOCAL,
    compute: str = "auto",
    *,
    temperature: float,
    banned: Sequence[int] = (),
) -> torch.Tensor:
    """(rows, T-1) log-probs of the batch's labels under ``model`` (micro-batched, no grad)."""
    out = torch.zeros_like(batch.mask)
    for rows in plan(batch, max_tokens, world):
        mb = take_rows(batch, rows)
        logp, _ = forward_logprobs(model, mb, compute=compute, temperature=temperature, banned=banned)
        if rows:
            out[torch.tensor(rows), : logp.shape[1]] = logp.float()
    return out

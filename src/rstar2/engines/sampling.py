"""Choosing the next token of a batch of rows, each with its own sampling parameters."""

from __future__ import annotations

import torch

from .base import SamplingParams


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) what top-k and top-p exclude, per row. ``top_k`` 0 keeps every token."""
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device).unsqueeze(0)
    drop = rank >= k.unsqueeze(1)
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of the better tokens
    drop |= before >= top_p.unsqueeze(1)  # the best token always stays
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def next_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns (ids, log-probabilities under the temperature-scaled
    distribution before top-k/top-p, as engines commonly report them)."""
    logits = logits.float()
    banned = [(i, list(p.banned_token_ids)) for i, p in enumerate(params) if p.banned_token_ids]
    for i, ids in banned:
        logits[i, ids] = float("-inf")
    temps = torch.tensor([p.temperature for p in params], device=logits.device)
    greedy = temps == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps).unsqueeze(1)
    logp = scaled.log_softmax(dim=-1)
    tokens = scaled.argmax(dim=-1)
    sample_rows = (~greedy).nonzero().flatten().tolist()
    if sample_rows:
        rows = torch.tensor(sample_rows, device=logits.device)
        top_k = torch.tensor([params[i].top_k for i in sample_rows], device=logits.device)
        top_p = torch.tensor([params[i].top_p for i in sample_rows], device=logits.device)
        probs = filter_logits(scaled[rows], top_k, top_p).softmax(dim=-1)
        if all(generators[i] is None for i in sample_rows):
            picked = torch.multinomial(probs, 1).squeeze(1)
        else:  # a seeded request draws from its own generator, whatever else shares the batch
            picked = torch.stack(
                [
                    torch.multinomial(probs[j], 1, generator=generators[i]).squeeze(0)
                    for j, i in enumerate(sample_rows)
                ]
            )
        tokens[rows] = picked
    return tokens, logp.gather(1, tokens.unsqueeze(1)).squeeze(1)

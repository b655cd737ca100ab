"""Choosing the next token of a batch of rows, each with its own sampling parameters."""

from __future__ import annotations

import random

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
    logits: torch.Tensor, params: list[SamplingParams], generators: list[random.Random | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns (ids, log-probabilities under the temperature-scaled
    distribution before top-k/top-p, as engines commonly report them).

    A seeded request draws its uniforms from its own ``random.Random``, so what it samples does not
    depend on what else shares the batch; all rows are then sampled at once by inverse CDF (one
    vectorised search instead of a ``multinomial`` call per row)."""
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
        every = len(sample_rows) == len(params)
        rows = torch.tensor(sample_rows, device=logits.device)
        if any(params[i].top_k > 0 or params[i].top_p < 1 for i in sample_rows):
            top_k = torch.tensor([params[i].top_k for i in sample_rows], device=logits.device)
            top_p = torch.tensor([params[i].top_p for i in sample_rows], device=logits.device)
            probs = filter_logits(scaled if every else scaled[rows], top_k, top_p).softmax(dim=-1)
        else:  # no sort of the vocabulary, no second softmax
            probs = (logp if every else logp[rows]).exp()
        fresh = torch.rand(len(sample_rows), dtype=torch.float64).tolist()
        u = [
            g.random() if (g := generators[i]) is not None else r
            for i, r in zip(sample_rows, fresh, strict=True)
        ]
        tokens[rows] = inverse_cdf(probs, torch.tensor(u, dtype=torch.float64, device=logits.device))
    return tokens, logp.gather(1, tokens.unsqueeze(1)).squeeze(1)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the first token whose cumulative mass exceeds the share ``u`` (in [0, 1]) of the
    row's total: a token of zero probability is never picked, whatever the rounding of the sum."""
    cdf = probs.double().cumsum(dim=-1)
    target = (u.double().clamp(0.0, 1.0 - 1e-12) * cdf[:, -1]).unsqueeze(1)
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=probs.shape[-1] - 1)

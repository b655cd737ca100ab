"""GRPO pieces as small functions: group advantages, token log-probs, the clipped token-level loss.
The loss is per token, weighted by ``token_weights`` computed once for the whole batch, so
micro-batches, accumulation and several processes give the same gradient as one pass."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F

from ...config import DEFAULT_LOSS, LossSection

Aggregation = Literal["token-mean", "group-token-mean"]


def group_advantages(
    groups: Sequence[Sequence[float]],
    eps: float = DEFAULT_LOSS.adv_eps,
    scale_by_std: bool = DEFAULT_LOSS.scale_by_std,
) -> list[list[float]]:
    """(r - mean) / (std + eps) within each group (std with Bessel's correction, as torch.std and
    the released recipe); ``scale_by_std=False`` gives r - mean (Dr. GRPO). A group of one has 0."""
    out = []
    for g in groups:
        mean = sum(g) / len(g) if g else 0.0
        std = math.sqrt(sum((r - mean) ** 2 for r in g) / (len(g) - 1)) if len(g) > 1 else 0.0
        out.append([(r - mean) / (std + eps) if scale_by_std else r - mean for r in g])
    return out


def token_weights(
    mask: torch.Tensor,
    group_index: torch.Tensor | None = None,
    aggregation: Aggregation = DEFAULT_LOSS.aggregation,
    units: float | None = None,
) -> torch.Tensor:
    """Per-token weights summing to 1 over the batch (0 where masked out; all 0 if nothing is in).
    ``token-mean``: every model token counts the same (DAPO, the released recipe);
    ``group-token-mean``: token mean within each group, then mean over groups (Eq. 6). ``units``: the
    whole batch's denominator when another process holds part of it (default: these rows')."""
    mask = mask.to(torch.float32)
    if aggregation == "token-mean":
        raw = mask
    elif aggregation == "group-token-mean":
        if group_index is None:
            raise ValueError("group-token-mean needs the group index of every row")
        row_tokens = mask.sum(dim=1)
        sums = row_tokens.new_zeros(int(group_index.max()) + 1 if len(group_index) else 0)
        group_tokens = sums.index_add_(0, group_index, row_tokens)[group_index]
        raw = mask / group_tokens.clamp(min=1.0)[:, None]
    else:
        raise ValueError(f"unknown loss aggregation {aggregation!r}: use token-mean or group-token-mean")
    total = weight_units(mask, group_index, aggregation) if units is None else units
    return raw / total if total > 0 else torch.zeros_like(mask)


def weight_units(mask: torch.Tensor, group_index: torch.Tensor | None, aggregation: Aggregation) -> float:
    """The denominator of ``token_weights``: masked tokens, or groups that have any."""
    if aggregation == "token-mean":
        return float(mask.sum())
    row_tokens = mask.to(torch.float32).sum(dim=1)
    return float(torch.unique(group_index[row_tokens > 0]).numel())


def token_logprobs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    with_entropy: bool = False,
    *,
    temperature: float,
    banned: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(label) per position in fp32 at least (and each position's entropy), under ``logits /
    temperature`` (0 = greedy: unscaled) without the ``banned`` ids: what the engine sampled from,
    else pi/mu is biased by the banned mass m. Renormalised from the banned columns alone
    (log p' = log p - log(1 - m)): a ban costs a gather, not a copy of the logits."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if temperature > 0 and temperature != 1:
        logits = logits / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    columns = labels.unsqueeze(-1)
    bans = banned is not None and banned.numel() > 0
    if bans:  # the labels' and the banned columns in one gather (one scatter in the backward)
        columns = torch.cat([columns, banned.to(labels.device).expand(*labels.shape, -1)], dim=-1)
    picked = logp_all.gather(-1, columns)
    logp = picked[..., 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    if bans:
        logp_banned = picked[..., 1:]
        p_banned = logp_banned.exp()
        mass = p_banned.sum(-1).clamp(max=1.0 - 1e-6)  # the engine never samples where it is all
        log_kept = torch.log1p(-mass)
        logp = logp - log_kept
        if entropy is not None:  # H' = (H + sum_b p_b log p_b) / (1 - m) + log(1 - m)
            entropy = (entropy + (p_banned * logp_banned).sum(-1)) / (1.0 - mass) + log_kept
    return logp, entropy


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    cfg: LossSection = DEFAULT_LOSS,
    *,
    engine_logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate per token, summed with ``weights``; all tensors (rows, T). Returns the
    loss and weighted sums for metrics (clip fractions, approximate KL to the old policy, entropy,
    the engine-vs-trainer logprob gap), to divide by the batch's summed weights."""
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    per_token = torch.maximum(-advantages * ratio, -advantages * clipped)
    if cfg.tis_cap is not None and engine_logp is not None:
        per_token = per_token * (old_logp - engine_logp).exp().clamp(max=cfg.tis_cap).detach()
    kl_ref = None
    if ref_logp is not None:  # k3 estimate of KL(new || reference): in the loss where kl_coef > 0
        d = (ref_logp - logp).clamp(-20.0, 20.0)
        kl_ref = d.exp() - d - 1.0
        if cfg.kl_coef:
            per_token = per_token + cfg.kl_coef * kl_ref
    if cfg.entropy_coef and entropy is not None:
        per_token = per_token - cfg.entropy_coef * entropy
    loss = (per_token * weights).sum()

    with torch.no_grad():
        w = weights.detach()
        stats = {
            "weight": w.sum(),
            "clip_low": (((ratio < 1.0 - cfg.clip_low) & (advantages < 0)).float() * w).sum(),
            "clip_high": (((ratio > 1.0 + cfg.clip_high) & (advantages > 0)).float() * w).sum(),
            "approx_kl": ((ratio - 1.0 - log_ratio) * w).sum(),  # k3 estimate of KL(old || new)
        }
        if entropy is not None:
            stats["entropy"] = (entropy * w).sum()
        if engine_logp is not None:
            stats["engine_gap"] = ((old_logp - engine_logp).abs() * w).sum()
        if kl_ref is not None:
            stats["ref_kl"] = (kl_ref.detach() * w).sum()
    return loss, stats

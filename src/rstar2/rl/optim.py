"""AdamW with linear warm-up, then a constant or cosine learning rate (shared by SFT and RL)."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def lr_factor(step: int, warmup: int, total: int, schedule: str = "constant", floor: float = 0.1) -> float:
    """Multiplier of the base lr at optimizer step ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"unknown lr schedule {schedule!r}: use constant or cosine")
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, cfg, total_steps: int) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """``cfg`` is an ``OptimSection``: lr, betas, weight_decay (not on biases and norms), schedule."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=1e-8)
    return opt, LambdaLR(
        opt, lambda s: lr_factor(s, cfg.warmup_steps, total_steps, cfg.schedule, cfg.min_lr_ratio)
    )

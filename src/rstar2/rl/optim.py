"""AdamW with linear warm-up, then a constant or cosine learning rate; the optimizer step SFT and RL share."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from ..config import DEFAULT_OPTIM
from .run.distributed import LOCAL, World, all_sum


class Learner(NamedTuple):
    """The model being trained, its optimizer and schedule, and the processes that share it."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr_schedule: LRScheduler
    world: World = LOCAL


def start_step(learner: Learner) -> dict[str, float]:
    """Gradients zeroed; the sums ``accumulate`` adds each micro-batch's loss and statistics to."""
    learner.model.train()
    learner.optimizer.zero_grad(set_to_none=True)
    return {"loss": 0.0}


def accumulate(
    loss: torch.Tensor, stats: dict[str, torch.Tensor], sums: dict[str, float], world: World
) -> None:
    """One micro-batch's gradients (its ``loss`` already weighted for the whole batch) and sums."""
    (loss * world.size).backward()  # FSDP averages gradients over processes: the weights are global
    for k, v in {"loss": loss.detach(), **stats}.items():
        sums[k] = sums.get(k, 0.0) + float(v)


def finish_step(learner: Learner, sums: dict[str, float], grad_clip: float) -> dict[str, float]:
    """Clip, one optimizer and learning-rate step; the sums over all processes, the norm and lr."""
    model, optimizer, lr_schedule, world = learner
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    optimizer.step()
    lr_schedule.step()
    totals = dict(zip(sums, all_sum(list(sums.values()), world), strict=True))
    return {**totals, "grad_norm": grad_norm, "lr": lr_schedule.get_last_lr()[0]}


def lr_factor(
    step: int,
    warmup: int,
    total: int,
    schedule: str = DEFAULT_OPTIM.schedule,
    floor: float = DEFAULT_OPTIM.min_lr_ratio,
) -> float:
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

"""``rstar2 train CONFIG``: the trainer a config names, run to its end. Apart from ``launch.py``,
which both trainers start from, so that no module of ``rl/`` imports itself through the others."""

from __future__ import annotations

import asyncio
import os

from ..config import TrainConfig


def train_config(cfg: TrainConfig, resume: bool) -> str:
    """The SFT or RL run to its end; the line the command ends with (rank 0 only, else empty)."""
    if cfg.kind == "sft":
        from .sft import SFTTrainer

        history = SFTTrainer(cfg, resume=resume).train()
    else:
        from .trainer import RLTrainer

        history = asyncio.run(RLTrainer(cfg, resume=resume).train())
    if not history or int(os.environ.get("RANK", "0")) != 0:  # under torchrun, rank 0 speaks
        return ""
    keys = ("loss", "accuracy", "reward/mean", "grad_norm")
    shown = {k: round(v, 4) for k, v in history[-1].items() if k in keys}
    return f"done: {len(history)} steps this run; last step {shown}; run folder {cfg.run.out}"

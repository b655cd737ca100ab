"""``rstar2 train CONFIG``: the trainer a config names, run to its end. Apart from ``launch.py``,
which both trainers start from, so that no module of ``rl/`` imports itself through the others."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from ..config import TrainConfig
from ..config_files import ConfigError


def check_paths(cfg: TrainConfig) -> None:
    """Every path a config names exists (and reasoning-gym knows its tasks), said by name before the
    run starts: a model path that is not a folder would otherwise reach the hub's rules for names."""
    from ..problems import check_source

    folders = {
        "model.path": cfg.model.path,
        "model.tokenizer": cfg.model.tokenizer,
        "run.init_from": cfg.run.init_from,
    }
    for key, path in folders.items():
        if path is not None and not Path(path).is_dir():
            raise ConfigError(f"{key}: {path} does not exist (a local Hugging Face model folder)")
    if cfg.kind == "rl":
        check_source(cfg.data.gym or cfg.data.train, cfg.data.columns)
        return
    for key, path in {"data.train": cfg.data.train, "sft.probe": cfg.sft.probe}.items():
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"{key}: {path} does not exist")


def train_config(cfg: TrainConfig, resume: bool) -> str:
    """The SFT or RL run to its end; the line the command ends with (rank 0 only, else empty)."""
    check_paths(cfg)
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

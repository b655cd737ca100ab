"""Checkpoints that resume exactly and that Hugging Face loads as they are: ``step-000012/`` holds
the model (or only its adapter) and tokenizer, ``trainer_state.pt`` (optimizer, schedule, RNG) and
``state.json``. Each is written to a temporary folder and renamed when complete, so a run killed
while saving leaves the previous one intact."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from ...adapters import adapted, save_adapter
from ...auth import follow_umask
from .distributed import LOCAL, World, barrier, full_state_dict

_STEP_DIR = re.compile(r"^step-(\d+)$")


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    return (list_checkpoints(run_dir) or [None])[-1]


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_schedule: Any,
    tokenizer: Any,
    state: dict[str, Any],
    world: World = LOCAL,
    keep: int = 2,
) -> Path:
    """Save step ``step``; every process must call it (the weights are gathered), rank 0 writes."""
    final = Path(run_dir) / "checkpoints" / f"step-{step:06d}"
    weights = full_state_dict(model, world)
    if world.distributed:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        optim_state = get_optimizer_state_dict(model, optimizer, options=options)
    else:
        optim_state = optimizer.state_dict()
    if world.main:
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if adapted(model):  # the adapter alone; its config names the base model it needs
            save_adapter(model, tmp, weights)
        else:
            cpu = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
            model.save_pretrained(tmp, state_dict=cpu, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        blob = {"optimizer": optim_state, "scheduler": lr_schedule.state_dict(), "rng": rng}
        torch.save(blob, tmp / "trainer_state.pt")
        (tmp / "state.json").write_text(json.dumps({**state, "step": step}, indent=2))
        follow_umask(tmp)  # safetensors writes 0o600: a server running as another user loads these too
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    barrier(world)
    return final


def load_trainer_state(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_schedule: Any,
    world: World = LOCAL,
) -> dict[str, Any]:
    """Restore optimizer, schedule and RNG from ``path`` (the model came from it); its ``state.json``."""
    path = Path(path)
    blob = _trainer_blob(path)
    _set_optimizer_state(model, optimizer, blob["optimizer"], world)
    lr_schedule.load_state_dict(blob["scheduler"])
    rng = blob["rng"]
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return json.loads((path / "state.json").read_text())


def carry_optimizer_state(
    path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, world: World = LOCAL
) -> bool:
    """The previous stage's AdamW moments for a new stage from its checkpoint ``path`` (its own settings
    kept); False for a plain model folder."""
    if not (Path(path) / "trainer_state.pt").exists():
        return False
    mine = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    _set_optimizer_state(model, optimizer, _trainer_blob(Path(path))["optimizer"], world)
    for group, settings in zip(optimizer.param_groups, mine, strict=True):
        group.update(settings)
    return True


def _trainer_blob(path: Path) -> dict[str, Any]:
    return torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)


def _set_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict, world: World
) -> None:
    if world.distributed:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(state)

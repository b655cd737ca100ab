"""What each RL step's update consumed and what it produced, kept when ``run.keep_steps`` is on, so
``rstar2 replay`` can redo the step and say whether the result is the same (rl/replay.py).

One file a step, ``kept/step_000012.json.gz`` (``KeptStep``): whole groups, faulty rollouts too, so
RoC sees the same groups again. JSON keeps a float exactly (shortest repr), so the token ids, masks,
behaviour log-probs and versions read back are the ones trained on."""

from __future__ import annotations

import base64
import gzip
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import xxhash

from ...rollout.trajectory import Trajectory

KEPT_DIR = "kept"
# update_on_rollouts' arguments that the config does not hold
PLAIN_ARGS = ("pad_id", "banned")


def kept_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / KEPT_DIR / f"step_{step:06d}.json.gz"


def kept_steps(run_dir: str | Path) -> list[int]:
    return sorted(int(p.name[5:11]) for p in (Path(run_dir) / KEPT_DIR).glob("step_??????.json.gz"))


def fingerprint(t: torch.Tensor) -> list[Any]:
    """[digest of the tensor's bytes, its L2 norm]: the digest says equal or not, the norm how far."""
    t = t.to_local() if hasattr(t, "to_local") else t  # FSDP: this process's shard
    x = t.detach().to("cpu").contiguous().reshape(-1)
    digest = xxhash.xxh3_128_hexdigest(x.view(torch.uint8).numpy()) if x.numel() else ""
    return [digest, float(x.float().norm()) if x.is_floating_point() else float(x.sum())]


def fingerprints(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, list[Any]]:
    """Of every weight (``model/NAME``) and optimizer tensor (``optimizer/NAME/exp_avg`` …) by name."""
    out = {f"model/{n}": fingerprint(p) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        for k, v in optimizer.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                out[f"optimizer/{n}/{k}"] = fingerprint(v)
    return out


def rng_state(device: torch.device) -> dict[str, str]:
    out = {"cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if device.type == "cuda":
        out["cuda"] = base64.b64encode(torch.cuda.get_rng_state(device).numpy().tobytes()).decode()
    return out


def set_rng_state(state: dict[str, str], device: torch.device) -> None:
    def tensor(s: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)

    torch.set_rng_state(tensor(state["cpu"]))
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(tensor(state["cuda"]), device)


@dataclass
class KeptStep:
    """One step's record; ``keeping`` fills in what only the update's thread knows."""

    step: int
    cwd: str  # where the config's relative paths start
    config: dict[str, Any]  # the RL config as this step trained
    precision: str  # what the passes computed in: bf16 | fp32
    group_ids: list[int]  # RoC's random choices are seeded by them
    groups: list[list[Trajectory]]
    choices: list[list[int]]
    advantages: list[float]
    world_size: int = 1
    args: dict[str, Any] = field(default_factory=dict)  # the update's plain arguments (pad_id, banned …)
    threads: int = 0
    rng: dict[str, str] = field(default_factory=dict)
    result: dict[str, float] = field(default_factory=dict)
    after: dict[str, list[Any]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # the fingerprints' cost

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "groups"}
        return {**d, "groups": [[t.to_dict() for t in g] for g in self.groups]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KeptStep:
        groups = [[Trajectory.from_dict(t) for t in g] for g in d["groups"]]
        return cls(**{**d, "groups": groups})


def write_kept(run_dir: str | Path, kept: KeptStep, rank: int = 0) -> Path:
    """Written whole or not at all (a temporary file renamed), by every process under its rank."""
    path = kept_path(run_dir, kept.step)
    if rank:
        path = path.with_name(path.name.replace(".json.gz", f".rank{rank}.json.gz"))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", compresslevel=1) as f:
        json.dump(kept.to_dict(), f)
    tmp.rename(path)
    return path


def read_kept(run_dir: str | Path, step: int) -> KeptStep:
    with gzip.open(kept_path(run_dir, step), "rt") as f:
        return KeptStep.from_dict(json.load(f))


def keeping(update: Callable[..., dict[str, Any]], kept: KeptStep, run_dir: Path, rank: int) -> Callable:
    """``update`` (``update_on_rollouts``) that also keeps the step: the threads and random state it
    starts with, inside its own thread (an update beside an engine copy has fewer threads, and the
    thread count can change a sum's order), its metrics and the fingerprints of what it changed."""

    def run(learner, *args: Any, **kw: Any) -> dict[str, Any]:
        kept.args = {k: list(v) if k == "banned" else v for k, v in kw.items() if k in PLAIN_ARGS}
        kept.threads = torch.get_num_threads()
        kept.rng = rng_state(learner.world.device)
        out = update(learner, *args, **kw)
        t0 = time.perf_counter()
        kept.result = dict(out)
        kept.after = fingerprints(learner.model, learner.optimizer)
        kept.seconds = {"fingerprints": time.perf_counter() - t0}
        write_kept(run_dir, kept, rank)
        return out

    return run

"""``rstar2 replay``: redo kept RL steps (``run.keep_steps``) and compare them with the run.

The state before step N is the last checkpoint before it (or the run's start), then every kept step
after it, each redone by the trainer's own ``select_rows`` and ``update_on_rollouts`` with the
threads and random state the run's update had; after each, every weight and optimizer tensor is
compared with the fingerprint the run kept. A what-if (``--set loss.clip_high=0.2``) redoes step N
from the same state as it ran and as changed, side by side. Reports go to ``RUN/replay/``."""

from __future__ import annotations

import copy
import itertools
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..chat.token_classes import TokenClasses
from ..config import RLConfig
from ..config_files import ConfigError, parse_config
from ..device import resolve_precision
from .algorithm.select import Selection, select_rows
from .optim import Learner, build_optimizer
from .passes import logprobs_of
from .run import distributed as D
from .run.checkpoint import list_checkpoints
from .run.keep import KeptStep, fingerprints, kept_steps, read_kept, set_rng_state
from .run.launch import Start, load_learner, load_reference
from .run.sync import saved_tensors
from .update import optimizer_steps, rows_batch, stand_in, update_on_rollouts

REPLAY_DIR = "replay"
# the settings a what-if may change: the update's own (not what was sampled, or by whom)
WHAT_IF_SECTIONS = ("loss", "roc", "optim")
COMPARED = ("loss", "grad_norm", "update/entropy", "update/clip_low", "update/clip_high", "lr")


class NotReplayable(ValueError):
    """What a replay needs and the run folder does not have."""


@dataclass
class StepResult:
    """One redone step against the run: every tensor and metric, equal or how far apart."""

    step: int
    # name -> equal (bit for bit), close (within the replay's rtol), run_norm, replay_norm, and
    # max_abs where the run saved a checkpoint after this step
    tensors: dict[str, dict[str, Any]]
    metrics: dict[str, dict[str, Any]]  # name -> run, replay, equal, close
    choices_equal: bool
    advantages_equal: bool
    seconds: float = 0.0

    @property
    def differing(self) -> list[str]:
        return [k for k, v in self.tensors.items() if not v["close"]]

    @property
    def matches(self) -> bool:
        """Every tensor and metric equal, or within the replay's tolerance; RoC chose the same."""
        close = all(v["close"] for v in self.metrics.values())
        return not self.differing and close and self.choices_equal and self.advantages_equal

    @property
    def bit_for_bit(self) -> bool:
        return self.matches and all(v["equal"] for v in [*self.tensors.values(), *self.metrics.values()])


@dataclass
class Replay:
    """A replay's report: where it started and each step redone (``what_if`` when a setting changed)."""

    run: str
    start: str  # "checkpoint step-000010" or "the run's start"
    steps: list[StepResult] = field(default_factory=list)
    what_if: dict[str, Any] | None = None
    device: str = ""
    rtol: float = 0.0  # a tensor or metric this close (relative) to the run's counts as the same

    @property
    def first_difference(self) -> StepResult | None:
        return next((s for s in self.steps if not s.matches), None)


# -- where a replay starts --------------------------------------------------------------------
def plan(run_dir: Path, first: int, last: int) -> tuple[Path | None, list[int]]:
    """The checkpoint to start from (None: the run's start) and the steps to redo, through ``last``."""
    if first < 1 or last < first:
        raise NotReplayable(f"steps {first}..{last}: give steps from 1 on, the first not after the last")
    kept = set(kept_steps(run_dir))
    if not kept:
        raise NotReplayable(
            f"{run_dir} kept no step ({run_dir / 'kept'} is missing or empty): the run needs "
            "run.keep_steps: true to be replayed"
        )
    before = [c for c in list_checkpoints(run_dir) if _step_of(c) < first]
    checkpoint = before[-1] if before else None
    steps = list(range(_step_of(checkpoint) + 1, last + 1))
    missing = [s for s in steps if s not in kept]
    if missing:
        where = f"checkpoint {checkpoint.name}" if checkpoint else "the run's start (no checkpoint before it)"
        raise NotReplayable(
            f"step {first} is redone from {where}, which needs the kept steps {steps[0]}..{last}; "
            f"{run_dir / 'kept'} lacks {_ranges(missing)} (kept: {_ranges(sorted(kept))}; checkpoints: "
            f"{', '.join(c.name for c in list_checkpoints(run_dir)) or 'none'})"
        )
    return checkpoint, steps


def _step_of(checkpoint: Path | None) -> int:
    return int(checkpoint.name.split("-")[1]) if checkpoint else 0


def _ranges(steps: list[int]) -> str:
    """Ascending steps as runs: "1-3, 5"."""
    runs = [[s for _, s in run] for _, run in itertools.groupby(enumerate(steps), lambda p: p[1] - p[0])]
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs) or "none"


# -- the state ----------------------------------------------------------------------------------
@dataclass
class State:
    cfg: RLConfig
    learner: Learner
    tokenizer: Any
    ref_model: torch.nn.Module | None
    updates: int  # the schedule's length


def load_state(record: KeptStep, checkpoint: Path | None) -> State:
    """The learner as the run stood at ``checkpoint`` (or its start), with the config of ``record``."""
    from transformers import AutoTokenizer

    if record.world_size > 1:
        raise NotReplayable(
            f"the run trained in {record.world_size} processes (torchrun): replay redoes runs of one process"
        )
    cfg = config_of(record)
    world = D.init_world(cfg.model.device)
    path = str(checkpoint or cfg.run.init_from or cfg.model.path)
    if not Path(path).exists():
        raise NotReplayable(f"the run started from {path}, which is not there any more")
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer or path)
    start = Start(world, tokenizer, path, checkpoint, resolve_precision(world.device, record.precision))
    updates = optimizer_steps(cfg)
    learner, _, _ = load_learner(cfg, start, updates)  # cfg: as the run trained (micro-batches fitted)
    ref = load_reference(cfg, learner.model, world) if cfg.needs_reference else None
    return State(cfg, learner, tokenizer, ref, updates)


def config_of(record: KeptStep, overrides: list[str] | tuple[str, ...] = ()) -> RLConfig:
    """The step's config, its relative paths taken from where the run ran."""
    tree = copy.deepcopy(record.config)
    for section, key in (("model", "path"), ("model", "tokenizer"), ("run", "init_from")):
        if tree[section].get(key):
            tree[section][key] = str(Path(record.cwd) / tree[section][key])  # an absolute one stays
    return parse_config(tree, overrides)


def snapshot(learner: Learner) -> dict[str, Any]:
    return {
        "model": {k: v.detach().clone() for k, v in learner.model.state_dict().items()},
        "optimizer": copy.deepcopy(learner.optimizer.state_dict()),
        "scheduler": copy.deepcopy(learner.lr_schedule.state_dict()),
    }


def restore(state: State, saved: dict[str, Any], optim_cfg: Any, ran: Any) -> None:
    """``saved`` back into the model, optimizer and schedule. A what-if's other ``optim_cfg``: its
    settings (betas, weight decay, the schedule and its lr at the saved step count) over the saved
    moments, as a new stage carries a checkpoint's (``ran``: the run's optimizer settings)."""
    model = state.learner.model
    model.load_state_dict(saved["model"])
    optimizer, schedule = build_optimizer(model, optim_cfg, state.updates)
    mine = [
        {k: v for k, v in g.items() if k not in ("params", "lr", "initial_lr")}
        for g in optimizer.param_groups
    ]
    optimizer.load_state_dict(copy.deepcopy(saved["optimizer"]))
    schedule.load_state_dict(copy.deepcopy(saved["scheduler"]))  # the schedule's function is optim_cfg's
    if optim_cfg != ran:
        schedule.base_lrs = [optim_cfg.lr] * len(schedule.base_lrs)
        for group, own, fn in zip(optimizer.param_groups, mine, schedule.lr_lambdas, strict=True):
            group.update(own, initial_lr=optim_cfg.lr, lr=optim_cfg.lr * fn(schedule.last_epoch))
    state.learner = Learner(model, optimizer, schedule, state.learner.world)


# -- one step -----------------------------------------------------------------------------------
def redo(state: State, record: KeptStep, cfg: RLConfig | None = None) -> tuple[dict[str, float], Selection]:
    """Step ``record.step``'s update as the run did it (``cfg``: other settings), in its threads and RNG."""
    cfg = cfg or config_of(record)
    torch.set_num_threads(record.threads)
    set_rng_state(record.rng, state.learner.world.device)
    chosen = select_rows(record.groups, record.group_ids, record.step, cfg)
    window = cfg.run.reflection_window
    out = update_on_rollouts(
        state.learner,
        chosen.rows,
        stand_in(record.groups, record.args["pad_id"]),
        cfg,
        pad_id=record.args["pad_id"],
        banned=record.args["banned"],
        ref_model=state.ref_model,
        token_classes=TokenClasses(state.tokenizer, window) if window else None,
        compute=record.precision,
    )
    state.learner.model.eval()
    return out, chosen


def compare(
    state: State, record: KeptStep, out: dict[str, float], chosen: Selection, run_dir: Path, rtol: float = 0.0
) -> StepResult:
    """The state after a redone step against the run's fingerprints (and its checkpoint, where it
    saved one then). ``rtol`` > 0 (a replay on another GPU model or library): a tensor whose bits
    differ but whose norm and largest difference are within ``rtol`` of the run's counts as close."""
    now = fingerprints(state.learner.model, state.learner.optimizer)
    differ = any(now.get(name, [None])[0] != digest for name, (digest, _) in record.after.items())
    # the run's weights after the step where it saved a checkpoint then (else nothing: norms only)
    saved = saved_tensors(Path(run_dir) / "checkpoints" / f"step-{record.step:06d}") if differ else {}
    tensors: dict[str, dict[str, Any]] = {}
    params = dict(state.learner.model.named_parameters())
    for name, (digest, norm) in record.after.items():
        mine = now.get(name)
        row = {
            "equal": mine is not None and mine[0] == digest,
            "run_norm": norm,
            "replay_norm": mine and mine[1],
        }
        key = name.removeprefix("model/")
        if not row["equal"] and key in saved and key in params:
            ran = saved[key].float()
            row["max_abs"] = float((params[key].detach().float().cpu() - ran).abs().max())
            row["max_rel"] = row["max_abs"] / max(float(ran.abs().max()), 1e-30)
        near = mine is not None and _close(norm, mine[1], rtol) and row.get("max_rel", 0.0) <= rtol
        tensors[name] = {**row, "close": row["equal"] or (rtol > 0 and near)}
    metrics = {}
    for k, v in record.result.items():
        if isinstance(v, (int, float)):
            got, equal = out.get(k), _same(v, out.get(k))
            metrics[k] = {"run": v, "replay": got, "equal": equal, "close": equal or _close(v, got, rtol)}
    advantages = [r.advantage for r in chosen.rows]
    return StepResult(
        record.step,
        tensors,
        metrics,
        choices_equal=[c.kept for c in chosen.choices] == record.choices,
        advantages_equal=len(advantages) == len(record.advantages)
        and all(_same(a, b) for a, b in zip(advantages, record.advantages, strict=True)),
    )


def _close(a: Any, b: Any, rtol: float) -> bool:
    if not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        return False
    return abs(a - b) <= rtol * max(abs(a), abs(b))


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


# -- the commands -------------------------------------------------------------------------------
def replay(
    run_dir: str | Path,
    first: int,
    last: int | None = None,
    overrides: list[str] | None = None,
    progress: Any = None,
    rtol: float = 0.0,
) -> Replay:
    """Redo steps ``first``..``last`` (default: ``first`` alone) from the checkpoint before them; stop
    at the first that differs from the run beyond ``rtol`` (0: bit for bit). ``overrides``
    (loss./roc./optim. keys): a what-if on the last step."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per weight load
    for o in overrides or []:
        section = o.split("=", 1)[0].split(".", 1)[0]
        if section not in WHAT_IF_SECTIONS:
            raise ConfigError(
                f"--set {o}: a what-if changes the update's settings only ({', '.join(WHAT_IF_SECTIONS)}); "
                "what was sampled, and by which engine, is what the run kept"
            )
    run_dir = Path(run_dir)
    last = first if last is None else last
    checkpoint, steps = plan(run_dir, first, last)
    record = read_kept(run_dir, steps[0])
    state = load_state(record, checkpoint)
    report = Replay(
        str(run_dir),
        f"checkpoint {checkpoint.name}" if checkpoint else "the run's start",
        device=str(state.learner.world.device),
        rtol=rtol,
    )
    for step in steps:
        record = record if record.step == step else read_kept(run_dir, step)
        t0 = time.perf_counter()
        if overrides and step == last:
            report.what_if, result = what_if(state, record, overrides, run_dir, rtol)
        else:
            result = compare(state, record, *redo(state, record), run_dir, rtol)
        result.seconds = time.perf_counter() - t0
        report.steps.append(result)
        if progress:
            progress(result)
        if not result.matches:
            break
    return report


def what_if(
    state: State, record: KeptStep, overrides: list[str], run_dir: Path, rtol: float = 0.0
) -> tuple[dict[str, Any], StepResult]:
    """Step ``record.step`` redone from the same state as it ran and with ``overrides``, side by side
    (metrics, how far each trained token's probability moved); and as it ran, compared with the run."""
    ran, changed = config_of(record), config_of(record, overrides)
    if changed.needs_reference and state.ref_model is None:
        raise ConfigError("a what-if with loss.kl_coef needs the reference model the run did not load")
    saved = snapshot(state.learner)
    # the tokens the step trained as it ran: the ratio of both sides is measured on the same ones
    chosen = select_rows(record.groups, record.group_ids, record.step, ran)
    first, pad = stand_in(record.groups, record.args["pad_id"]), record.args["pad_id"]
    tokens = rows_batch(chosen.rows, first, pad, ran.loss.aggregation, None, state.learner.world)
    passes = dict(compute=record.precision, temperature=ran.rollout.temperature, banned=record.args["banned"])
    sides, as_run = {"as run": {}, "what-if": {}}, None  # the report's order
    for name, cfg in (("what-if", changed), ("as run", ran)):
        restore(state, saved, cfg.optim, ran.optim)
        before = logprobs_of(state.learner.model, tokens, cfg.optim.micro_batch_tokens, **passes)
        out, chosen = redo(state, record, cfg)
        if name == "as run":  # the state the run went on from, checked
            as_run = compare(state, record, out, chosen, run_dir, rtol)
        after = logprobs_of(state.learner.model, tokens, cfg.optim.micro_batch_tokens, **passes)
        sides[name] = {
            **{k: out[k] for k in COMPARED if k in out},
            "rows": len(chosen.rows),
            **_ratio_stats(after - before, tokens.mask.bool(), ran),
        }
    return {"step": record.step, "set": overrides, **sides}, as_run


def _ratio_stats(log_ratio: torch.Tensor, mask: torch.Tensor, cfg: RLConfig) -> dict[str, float]:
    """pi_after / pi_before over the trained tokens: mean, extremes, the share outside the clip range."""
    r = log_ratio[mask].double().exp()
    if not r.numel():
        return {}
    outside = (r < 1 - cfg.loss.clip_low) | (r > 1 + cfg.loss.clip_high)
    return {
        "ratio/mean": float(r.mean()),
        "ratio/min": float(r.min()),
        "ratio/max": float(r.max()),
        "ratio/outside_clip": float(outside.double().mean()),
    }


# -- the report ---------------------------------------------------------------------------------
def write_report(run_dir: str | Path, report: Replay, name: str) -> Path:
    """``RUN/replay/NAME.json`` and ``NAME.md`` (``rstar2 view`` shows them)."""
    folder = Path(run_dir) / REPLAY_DIR
    folder.mkdir(parents=True, exist_ok=True)
    data = asdict(report)
    data["first_difference"] = first.step if (first := report.first_difference) else None
    data["bit_for_bit"] = all(s.bit_for_bit for s in report.steps)
    (folder / f"{name}.json").write_text(json.dumps(data, indent=2))
    path = folder / f"{name}.md"
    path.write_text(summary(report) + "\n")
    return path


def summary(report: Replay) -> str:
    """The report in words: each step equal or not, and where it differs first."""
    lines = [f"# Replay of {report.run}", "", f"From {report.start}, on {report.device}.", ""]
    if report.steps:
        lines += [
            "| step | weights and optimizer tensors equal | metrics equal | RoC's choices | seconds |",
            "|---:|---|---|---|---:|",
        ]
        for s in report.steps:
            n_eq = sum(v["equal"] for v in s.tensors.values())
            m_eq = sum(v["equal"] for v in s.metrics.values())
            lines.append(
                f"| {s.step} | {n_eq} of {len(s.tensors)} | {m_eq} of {len(s.metrics)} | "
                f"{'same' if s.choices_equal and s.advantages_equal else 'differ'} | {s.seconds:.1f} |"
            )
        lines.append("")
        first = report.first_difference
        if first is None:
            how = (
                "bit for bit" if all(s.bit_for_bit for s in report.steps) else f"within rtol {report.rtol:g}"
            )
            lines.append(f"Every step redone is the run's, {how} ({len(report.steps)} steps).")
        else:
            lines.append(f"**Step {first.step} differs from the run** (later steps were not redone).")
            for name in first.differing[:10]:
                t = first.tensors[name]
                far = (
                    f"max |Δ| {t['max_abs']:.3g}"
                    if "max_abs" in t
                    else f"norm {t['run_norm']:.9g} → {t['replay_norm']:.9g}"
                )
                lines.append(f"- `{name}`: {far}")
            if len(first.differing) > 10:
                lines.append(f"- … and {len(first.differing) - 10} more tensors")
            for k, v in first.metrics.items():
                if not v["close"]:
                    lines.append(f"- metric `{k}`: run {v['run']!r}, replay {v['replay']!r}")
            if not (first.choices_equal and first.advantages_equal):
                lines.append("- RoC chose other rollouts or gave other advantages than the run did")
    if report.what_if:
        w = report.what_if
        keys = [k for k in w["as run"] if k in w["what-if"]]
        lines += [
            "",
            f"## What if {', '.join(w['set'])} at step {w['step']}",
            "",
            "| | as run | what-if | change |",
            "|---|---:|---:|---:|",
        ]
        for k in keys:
            a, b = w["as run"][k], w["what-if"][k]
            lines.append(f"| {k} | {a:.6g} | {b:.6g} | {b - a:+.4g} |")
        lines += [
            "",
            "ratio/*: each trained token's probability after the update over before it, on the tokens the step trained as it ran.",
        ]
    return "\n".join(lines)

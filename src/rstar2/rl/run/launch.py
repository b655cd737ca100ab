"""The start and end of a training run, shared by SFT and RL: process group, tokenizer, model,
sharding, optimizer and schedule (restored when resuming), metrics log; and, when a run fails, one
error that says what and where, with clean-up that never hides it."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...adapters import base_reference, load_model
from ...config import TrainConfig
from ...config_files import dump_config
from ...device import Precision, record, resolve_precision
from ..optim import Learner, build_optimizer
from . import distributed as D
from .checkpoint import carry_optimizer_state, latest_checkpoint, load_trainer_state, save_checkpoint
from .metrics_log import MetricsLog


@dataclass
class Start:
    world: D.World
    tokenizer: Any
    path: str  # where the weights come from: the last checkpoint, run.init_from or model.path
    checkpoint: Path | None
    precision: Precision  # model.compute on this machine


@dataclass
class Training:
    """What a run trains and keeps: the learner, the metrics log, where a resumed run stands."""

    learner: Learner
    resumed: dict[str, Any]  # the state.json of the checkpoint this run resumes from ({}: a new run)
    log: MetricsLog
    start: Start
    run_dir: Path
    cfg: TrainConfig  # as the run trains (``fit_to_memory``)

    @property
    def step(self) -> int:
        return int(self.resumed.get("step", 0))

    @property
    def data_position(self) -> int:
        return int(self.resumed.get("data_position", 0))

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Checkpoint ``step``; every process calls it (the weights are gathered), rank 0 writes."""
        model, optimizer, lr_schedule, world = self.learner
        parts = (model, optimizer, lr_schedule, self.start.tokenizer, state, world)
        return save_checkpoint(self.run_dir, step, *parts, keep=self.cfg.run.keep_checkpoints)


def begin(cfg: TrainConfig, resume: bool) -> Start:
    from transformers import AutoTokenizer

    if cfg.model.threads:
        torch.set_num_threads(cfg.model.threads)
    world = D.init_world(cfg.model.device)
    precision = resolve_precision(world.device, cfg.model.compute)  # warns here where bf16 is emulated
    if world.main:
        print(f"[rstar2] {cfg.kind} run {cfg.run.out}: {precision.describe()}", flush=True)
    torch.manual_seed(cfg.run.seed)
    ckpt = latest_checkpoint(cfg.run.out) if resume else None
    if resume and ckpt is None and world.main:
        print(f"[rstar2] no checkpoint in {cfg.run.out}/checkpoints: starting from step 0")
    path = str(ckpt or cfg.run.init_from or cfg.model.path)
    return Start(world, AutoTokenizer.from_pretrained(cfg.model.tokenizer or path), path, ckpt, precision)


def param_dtype(cfg: TrainConfig) -> torch.dtype:
    """The trained parameters' dtype: fp32 unless named (bf16 compute is autocast, ``model.compute``)."""
    return torch.float32 if cfg.model.dtype == "auto" else getattr(torch, cfg.model.dtype)


def load_reference(cfg: TrainConfig, model: torch.nn.Module, world: D.World) -> torch.nn.Module:
    """The KL's frozen reference: the policy this run (stage) started from, also when resuming (a new
    stage moves it to its start: the paper's stage 3); unsharded on each process."""
    start = cfg.run.init_from or cfg.model.path
    if not world.distributed and (base := base_reference(model, start)) is not None:
        return base  # an adapter new at this stage's start: its base is the start, no copy
    return load_model(start, param_dtype(cfg)).to(world.device).eval().requires_grad_(False)


def fit_to_memory(cfg: TrainConfig, vocab: int, world: D.World) -> TrainConfig:
    """The config as the run trains (a copy): ``optim.micro_batch_tokens`` lowered where its logits would
    not fit half the free memory. One process only: under torchrun every rank runs the same ones."""
    from ...memory import available_bytes, fit_micro_batch

    if world.size > 1:
        return cfg
    asked = cfg.optim.micro_batch_tokens
    fitted = fit_micro_batch(asked, vocab, available_bytes(str(world.device)))
    if fitted < asked:  # one process: the main one
        print(
            f"[rstar2] optim.micro_batch_tokens {asked} would hold ~{asked * vocab * 32 / 2**30:.0f} GiB "
            f"of logits ({vocab:,}-token vocabulary, more than half the memory free on {world.device}): "
            f"using {fitted}; set it in the config to choose",
            flush=True,
        )
        return cfg.model_copy(update={"optim": cfg.optim.model_copy(update={"micro_batch_tokens": fitted})})
    return cfg


def load_training(
    cfg: TrainConfig,
    start: Start,
    updates: int,
    before_shard: Callable[[torch.nn.Module], None] | None = None,
) -> Training:
    """``updates``: the schedule's length. ``before_shard`` sees the full model before FSDP shards it
    (the RL trainer copies it for its engine there). The run trains with ``Training.cfg``."""
    learner, resumed, cfg = load_learner(cfg, start, updates, before_shard, fit=True)
    run_dir = Path(cfg.run.out)
    log = MetricsLog(
        run_dir,
        tensorboard=cfg.run.tensorboard,
        enabled=start.world.main,
        resume_step=int(resumed.get("step", 0)),
        wandb=cfg.run.wandb,
        config=cfg.model_dump(mode="json"),
    )
    if start.world.main:
        (run_dir / "config.yaml").write_text(record(start.precision) + dump_config(cfg))
    return Training(learner, resumed, log, start, run_dir, cfg)


def load_learner(
    cfg: TrainConfig,
    start: Start,
    updates: int,
    before_shard: Callable[[torch.nn.Module], None] | None = None,
    fit: bool = False,
) -> tuple[Learner, dict[str, Any], TrainConfig]:
    """The learner as the run stands at ``start`` (restored, or new with the last stage's moments where
    asked), the checkpoint's state.json ({} when new) and the config to train with (``fit``:
    ``fit_to_memory``). Writes nothing: ``rstar2 replay`` loads a finished run's state with it."""
    world = start.world
    model = load_model(start.path, param_dtype(cfg), cfg.model.lora, cfg.run.seed).to(world.device)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        if cfg.model.lora is not None:  # frozen embeddings: the checkpointed blocks still need grads in
            model.enable_input_require_grads()
    if before_shard is not None:
        before_shard(model)
    model = D.shard(model, world)
    if fit:  # measured before any optimizer state is loaded: a resumed run fits as the first did
        cfg = fit_to_memory(cfg, model.config.vocab_size, world)
    optimizer, lr_schedule = build_optimizer(model, cfg.optim, updates)
    state: dict[str, Any] = {}
    if start.checkpoint is not None:  # resuming this run: everything as it was
        state = load_trainer_state(start.checkpoint, model, optimizer, lr_schedule, world)
    elif cfg.run.init_from and not cfg.optim.reset_optimizer:  # a new stage from the last one's checkpoint
        carry_optimizer_state(cfg.run.init_from, model, optimizer, world)
    return Learner(model, optimizer, lr_schedule, world), state, cfg


class RunError(RuntimeError):
    """A run stopped by an error: the first error, where, and the run folder (``error.txt`` in it)."""

    @classmethod
    def at(cls, where: str, run_dir: str | Path, exc: BaseException) -> RunError:
        """``where`` (e.g. "RL step 3") failed with ``exc``; an inner ``RunError`` gains the prefix."""
        if isinstance(exc, RunError):
            return cls(f"{where}: {exc}")
        return cls(f"{where} failed: {type(exc).__name__}: {exc} (run folder {run_dir})")


def write_error(run_dir: str | Path, exc: BaseException) -> None:
    """The whole traceback of what stopped the run, as ``error.txt`` in its folder."""
    with suppress(OSError):
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        (Path(run_dir) / "error.txt").write_text(text)


@contextmanager
def quietly(what: str = "clean-up") -> Iterator[None]:
    """Clean-up that never raises (said on stderr): a second error would replace the one propagating,
    and after a good run the work is already saved."""
    try:
        yield
    except Exception as exc:
        print(f"[rstar2] {what}: {type(exc).__name__}: {exc}", file=sys.stderr)


class Steps:
    """A run's steps as SFT and RL take them: a progress bar, checkpoints when due, where an error is."""

    def __init__(self, kind: str, cfg: TrainConfig, training: Training, total: int):
        self.kind, self.total = kind, total
        self.save_every = max(1, cfg.run.save_every)
        self.where = f"{kind} start"  # what a failure now belongs to
        self.bar = None
        if cfg.run.progress and training.start.world.main:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=training.step, desc=f"{kind.lower()} steps", unit="step")

    def begin(self, step: int) -> None:
        self.where = f"{self.kind} step {step}"

    def done(self, step: int, **shown: str) -> bool:
        """Step ``step`` ended (``shown`` beside the bar); whether a checkpoint is due."""
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(shown)
        return step == self.total or step % self.save_every == 0


@contextmanager
def run_steps(kind: str, cfg: TrainConfig, training: Training, total: int) -> Iterator[Steps]:
    """A failure becomes one ``RunError`` naming the step (traceback in ``error.txt``); all closed after."""
    steps, world = Steps(kind, cfg, training, total), training.start.world
    try:
        yield steps
    except BaseException as exc:
        if world.main:
            write_error(training.run_dir, exc)
        if isinstance(exc, Exception) and not isinstance(exc, RunError):
            raise RunError.at(steps.where, training.run_dir, exc) from exc
        raise
    finally:
        closers = [steps.bar.close] if steps.bar is not None else []
        for close in [*closers, training.log.close, lambda: D.close(world)]:
            with quietly():
                close()

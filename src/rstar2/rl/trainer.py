"""The RL trainer: one step = problems → 2G rollouts → rewards → RoC → advantages → update → sync.

Rollouts come from a ``GroupFeed`` (rl/staleness.py): with ``rollout.max_staleness: k > 0`` the
groups of up to k steps ahead keep generating while the trainer updates (the in-process engine then
holds a copy of the weights, refreshed after each update), and the loss is the decoupled objective
(``loss.tis_cap``); at k = 0 each step's groups start after the previous update, as ``step()`` does.

Rollouts go through the same ``Rollout`` as evaluation. In one synchronous process the in-process
engine shares the trainer's model object, so new weights cost nothing to publish; under torchrun every
process keeps a full copy for its own rollouts and reloads it after each update; remote servers
are told to load the newest weights from disk. Before the first group starts, every engine is given
the run's own weights and version (a server may hold another run's, or this one's from past the
checkpoint it resumes from), and before each update every token to train is checked to have been
sampled within ``max_staleness`` updates of the policy it trains. Everything a step needs to be redone identically
(sampling seeds, RoC's choices, the data order) derives from (seed, step), so a resumed run
continues exactly where the checkpoint left it.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import torch

from ..chat.token_classes import TokenClasses
from ..config import RLConfig, as_dataclass
from ..device import engine_dtype
from ..memory import trim_heap
from ..rollout import health, stats
from ..rollout.multi_turn import CodeEnvironment, Verifier
from ..rollout.trajectory import Trajectory
from . import distributed as D
from .data import DataStream
from .grpo import group_advantages
from .launch import RunError, begin, load_training, param_dtype, quietly, write_error
from .roc import RocConfig, roc_select, score
from .staleness import GroupFeed, StalenessError, check_versions, staleness_metrics
from .sync import publish
from .update import Row, update_on_rollouts

RewardFn = Callable[[Trajectory], float]
FINISH_REASONS = ("answer", "no_tool_call", "max_turns", "max_length", "error")
FAULT_KINDS = ("engine", "sandbox", "verifier")


def load_reward(spec: str) -> RewardFn:
    """``"package.module:function"`` → the function (a custom reward for ``reward:`` in a config)."""
    import importlib

    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(
            f"reward {spec!r}: cannot import it ({exc}); write it as package.module:function"
        ) from None
    if not callable(fn):
        raise ValueError(f"reward {spec!r} is not callable")
    return fn


def _seed(*parts: int) -> int:
    return hash(tuple(parts)) % (2**31 - 1)


def _record(t: Trajectory, kept: bool, p_err: float, p_format: float = 0.0) -> dict[str, Any]:
    """What the metrics need of one rollout (small, so processes can exchange it)."""
    return {
        **stats.record(t),
        "kept": kept,
        "p_err": p_err,
        "p_format": p_format,
        "tool_s": t.tool_seconds,
        "reward_s": float(t.meta.get("reward_s", 0.0)),
        "fault": t.fault,
    }


def _say(line: str) -> None:
    """A line on stderr that does not break a progress bar."""
    from tqdm.auto import tqdm

    tqdm.write(line, file=sys.stderr)


def fault_message(t: Trajectory) -> str:
    """What spoiled a rollout, in the system's words."""
    if t.fault == "sandbox":
        c = next(c for c in t.calls if c.fault)
        return f"code environment: {c.result.status}: {c.result.reason or c.result.stderr.strip()[-300:]}"
    return t.verdict


def step_metrics(all_records: list[dict[str, Any]]) -> dict[str, float]:
    """Accuracy, lengths, finish reasons and tool statistics of a step's rollouts (all processes),
    over those the system did not spoil; ``faults/*``: the shares it did, by kind."""
    faults = Counter(r["fault"] for r in all_records if r["fault"])
    faulted = {f"faults/{kind}": faults[kind] / max(1, len(all_records)) for kind in FAULT_KINDS}
    records = [r for r in all_records if not r["fault"]]
    n = max(1, len(records))
    d = stats.describe(records)
    finishes = d["finishes"]
    m = {
        "accuracy": d["accuracy"],
        "reward/mean": stats.mean([r["reward"] for r in records]),
        "reward/kept_mean": stats.mean([r["reward"] for r in records if r["kept"]]),
        "rollouts_kept": float(sum(r["kept"] for r in records)),
        "response/length_mean": d["length_mean"],
        "response/length_max": d["length_max"],
        "response/truncated_share": finishes["max_length"] / n,
        "tools/calls_per_traj": d["calls_per_traj"],
        "tools/error_ratio_all": d["error_ratio"],
        "tools/error_ratio_correct_all": d["error_ratio_correct"],
        "tools/error_ratio_correct_kept": stats.tool_error_ratio(
            [r for r in records if r["correct"] and r["kept"]]
        ),
        "tools/correct_with_error_share": d["correct_with_error_share"],
        # RoC's format fault: no answer, or more than one (p_format > 0), in all and in correct rollouts
        "format/fault_share": stats.mean([float(r.get("p_format", 0.0) > 0) for r in records]),
        "format/fault_share_correct": stats.mean(
            [float(r.get("p_format", 0.0) > 0) for r in records if r["correct"]]
        ),
        "time/tool_s_per_traj": stats.mean([r["tool_s"] for r in records]),
        "time/reward_s_per_traj": stats.mean([r["reward_s"] for r in records]),
    }
    for reason in FINISH_REASONS:
        m[f"finish/{reason}"] = finishes[reason] / n
    for sign, share in d["health"].items():
        m[f"health/{sign}"] = share
    return {**m, **faulted, "rollouts": float(len(all_records))}


def engine_metrics(
    before: list[dict[str, Any] | None], after: list[dict[str, Any] | None], wall_s: float
) -> dict[str, float]:
    """The engines' work over a step, from their counters (``HFEngine.counters``) read at its start
    and end: the share of rows a decode step held, the share of busy time spent on joins (prefill),
    the share of the step they were busy, prefixes evicted, rows prefilled again after new weights,
    and the mean wait of a request for a row. Engines without counters are left out."""
    pairs = [(b, a) for b, a in zip(before, after, strict=True) if b and a]
    if not pairs:
        return {}

    def d(key: str) -> float:
        return float(sum(a.get(key, 0) - b.get(key, 0) for b, a in pairs))

    row_capacity = sum(a["rows"] * (a["steps"] - b["steps"]) for b, a in pairs)
    busy = d("busy_s")
    return {
        "engine/occupancy": d("row_steps") / row_capacity if row_capacity else 0.0,
        "engine/join_share": d("prefill_s") / busy if busy > 0 else 0.0,
        "engine/busy_share": busy / (wall_s * len(pairs)) if wall_s > 0 else 0.0,
        "engine/evictions": d("evictions"),
        "engine/reprefills": d("reprefills"),
        "engine/queue_wait_s": d("queue_wait_s") / max(1.0, d("requests")),
    }


async def read_counters(engines: list[Any]) -> list[dict[str, Any] | None]:
    """Each engine's counters (a server over HTTP; None: it has none)."""
    return [await e.counters() if hasattr(e, "counters") else None for e in engines]


class RLTrainer:
    """Build with a config; ``await trainer.train()`` runs ``run.steps`` steps (resuming if asked)."""

    def __init__(
        self,
        cfg: RLConfig,
        *,
        resume: bool = False,
        reward_fn: RewardFn | None = None,
        code_env: CodeEnvironment | None = None,
        verifier: Verifier | None = None,
        lockstep: bool = False,
    ):
        """``code_env``/``verifier``: a running code environment and verifier pool to use (and leave
        open) instead of starting them from ``cfg.rollout``. ``lockstep``: run ``step()`` after
        ``step()`` (each step's rollouts, then its update), the plain synchronous loop that the fed
        one equals at ``max_staleness: 0``."""
        self.cfg = cfg
        self.lockstep = lockstep
        self._bars: dict[int, Callable[[Trajectory], None]] = {}  # rollout progress, per step
        self.services = {"code_env": code_env, "verifier": verifier}
        self.reward_fn = reward_fn or (load_reward(cfg.reward) if cfg.reward else None)
        self.resume = resume
        self.run_dir = Path(cfg.run.out)
        self.world = D.World()
        self.step_no = 0
        self.warnings: list[health.HealthWarning] = []  # the last step's (rollout/health.py)

    # -- set-up ------------------------------------------------------------------------------
    def _load(self) -> None:
        from ..problems import load_benchmark

        cfg = self.cfg
        start = begin(cfg, self.resume)
        self.world, self.tokenizer = start.world, start.tokenizer
        self.threads = torch.get_num_threads()  # model.threads, or torch's default (this thread's)
        self.engine_model = None
        window = cfg.run.reflection_window
        self.token_classes = TokenClasses(self.tokenizer, window) if window else None

        def engine_copy(model: torch.nn.Module) -> None:
            # The in-process engine shares the model in one synchronous process; it needs its own
            # copy with several processes, or when it generates while the update writes the weights.
            if cfg.rollout.servers:
                return
            if not self.world.distributed and not cfg.rollout.max_staleness:
                self.engine_model = model
            else:
                self.engine_model = copy.deepcopy(model).to(engine_dtype(self.world.device))

        updates = cfg.run.steps * cfg.optim.mini_batches * cfg.optim.epochs
        self.run = run = load_training(cfg, start, updates, before_shard=engine_copy)
        self.model, self.log, self.step_no = run.learner.model, run.log, run.step
        self.first_step, self.first_position = run.step, run.data_position
        h = cfg.run.health
        self.watch = health.Watch({s: getattr(h, s) for s in health.SIGNS}, h.patience, h.stop)
        if self.world.main:  # every process continues the counts of the file the main one keeps
            kept = health.keep_warnings_until(self.run_dir, self.step_no)
        else:
            kept = [w for w in health.read_warnings(self.run_dir) if w.get("step", 0) <= self.step_no]
        self.watch.resume(kept, self.step_no)
        self.ref_model = self._reference() if cfg.loss.kl_coef else None
        rows = load_benchmark(cfg.data.train)[: cfg.data.limit]
        self.problems = DataStream(rows, cfg.run.seed, cfg.data.shuffle, run.data_position)

    def _reference(self) -> torch.nn.Module:
        """The frozen reference of the KL term: the policy this run (stage) started from, also when
        resuming; a new stage starting from the last checkpoint updates the reference to it (the
        paper's stage 3). Each process holds a full, unsharded copy."""
        from transformers import AutoModelForCausalLM

        path = self.cfg.run.init_from or self.cfg.model.path
        ref = AutoModelForCausalLM.from_pretrained(path, dtype=param_dtype(self.cfg))
        ref = ref.to(self.world.device).eval()
        ref.requires_grad_(False)
        return ref

    # -- the loop ----------------------------------------------------------------------------
    async def train(self) -> list[dict[str, Any]]:
        """Run the remaining steps. A failure stops the run with a ``RunError`` that names the
        step and the first error (its traceback in ``error.txt`` of the run folder); clean-up that
        fails after it is only reported, and the folder keeps everything written so far."""
        from ..rollout.build import open_engines, open_rollout

        self._load()
        history: list[dict[str, Any]] = []
        # remote servers, or one in-process engine over the trainer's model (or its copy)
        self.engines = await open_engines(
            self.cfg.rollout,
            trainer_model=self.engine_model,
            name=f"rank{self.world.rank}",
            compute=self.cfg.model.compute,
        )
        bar = None
        if self.cfg.run.progress and self.world.main:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.cfg.run.steps, initial=self.step_no, desc="rl steps", unit="step")
        try:
            async with open_rollout(
                self.cfg.rollout, tokenizer=self.tokenizer, engines=self.engines, **self.services
            ) as rollout:
                self.rollout = rollout
                # every engine holds this run's weights and version before the first group starts (a
                # server may hold another run's, or this run's from after the checkpoint resumed)
                try:
                    await self._publish(self.step_no)
                except Exception as exc:
                    raise RunError.at("RL start", self.run_dir, exc) from exc
                self._counters = (time.perf_counter(), await read_counters(self.engines))
                self.feed = GroupFeed(
                    self._launch_group,
                    first_step=self.step_no,
                    last_step=self.cfg.run.steps,
                    batch_size=self.cfg.run.batch_size,
                    max_staleness=self.cfg.rollout.max_staleness,
                )
                try:
                    await self._loop(history, bar)
                finally:  # groups started for steps that will not run here (a resume redoes them)
                    await self.feed.close()
        except BaseException as exc:
            if self.world.main:
                write_error(self.run_dir, exc)
            raise
        finally:
            for e in self.engines:
                with quietly(f"closing engine {e.name}"):
                    await e.close()
            for close in ([bar.close] if bar is not None else []) + [self.log.close]:
                with quietly():
                    close()
            with quietly():
                D.close(self.world)
        return history

    async def _loop(self, history: list[dict[str, Any]], bar: Any) -> None:
        """The remaining steps: each step, its metrics, its checkpoint when due, and the stop a
        health limit asks for."""
        while self.step_no < self.cfg.run.steps:
            try:
                metrics = await (self.step() if self.lockstep else self._fed_step())
            except Exception as exc:
                raise RunError.at(f"RL step {self.step_no + 1}", self.run_dir, exc) from exc
            history.append(metrics)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(acc=f"{metrics['accuracy']:.2f}", loss=f"{metrics.get('loss', 0.0):.4f}")
            last = self.step_no == self.cfg.run.steps
            stop = self.watch.stop_reason(self.warnings)
            if last or stop or self.step_no % max(1, self.cfg.run.save_every) == 0:
                # off the event loop: rollouts of later steps go on meanwhile
                await asyncio.to_thread(D.on_device(self.world, self.save), metrics)
            if stop:  # every process saw the same gathered records: all stop here
                raise RunError(f"RL step {self.step_no}: {stop} (run folder {self.run_dir})")

    def save(self, metrics: dict[str, Any] | None = None) -> Path:
        # the problems of the steps trained so far (the feed may have taken later steps' already)
        position = self.first_position + (self.step_no - self.first_step) * self.cfg.run.batch_size
        state = {"data_position": position, "metrics": metrics or {}}
        return self.run.save(self.step_no, state)

    # -- one step ----------------------------------------------------------------------------
    def _items(self, step: int, g: int, problem: dict[str, Any]) -> list[dict[str, Any]]:
        """The ``rollout.samples`` rollouts of group ``g`` of ``step``; their seeds derive from
        (seed, step, group, sample), whatever the order they run in."""
        cfg = self.cfg
        return [
            {
                "problem": problem["problem"],
                "answer": None if self.reward_fn else str(problem["answer"]),
                "seed": _seed(cfg.run.seed, step, g, k),
                "priority": step,  # an engine short of rows serves earlier steps first
                "meta": {"group": g, "sample": k},
            }
            for k in range(cfg.rollout.samples)
        ]

    async def step(self) -> dict[str, Any]:
        """One synchronous step: this step's rollouts, then the update on them."""
        cfg, world = self.cfg, self.world
        step = self.step_no + 1
        t_step = time.perf_counter()
        problems = self.problems.take(cfg.run.batch_size)
        mine = list(range(world.rank, len(problems), world.size))  # this process's share, whole groups
        items = [item for g in mine for item in self._items(step, g, problems[g])]
        self.model.eval()
        t0 = time.perf_counter()
        trajs = await self.rollout.run_many(items, on_done=self._progress(step, len(items)))
        S = cfg.rollout.samples
        sampled = [trajs[i * S : (i + 1) * S] for i in range(len(mine))]
        return await self._train_on(step, mine, sampled, time.perf_counter() - t0, t_step)

    def _launch_group(self, i: int) -> Awaitable[list[Trajectory]]:
        """Group ``i`` of the run, admitted now: its problem taken from the data stream (groups are
        admitted in order), its rollouts started; model tokens whose sampler the engine does not
        report are given the version at admission (a lower bound)."""
        B = self.cfg.run.batch_size
        step, g = i // B + 1, i % B
        problem = self.problems.take(1)[0]
        if g % self.world.size != self.world.rank:  # another process's group
            return asyncio.sleep(0, result=[])
        items, admitted = self._items(step, g, problem), self.step_no
        mine = len(range(self.world.rank, B, self.world.size))
        on_done = self._progress(step, mine * self.cfg.rollout.samples)

        async def run() -> list[Trajectory]:
            trajs = await self.rollout.run_many(items, on_done=on_done)
            for t in trajs:
                t.meta["admitted_version"] = admitted
                t.versions = [
                    admitted if v < 0 and m else v for v, m in zip(t.versions, t.loss_mask, strict=True)
                ]
            return trajs

        return run()

    async def _fed_step(self) -> dict[str, Any]:
        """The next step's groups from the feed (started up to ``max_staleness`` updates ago), then
        the update on them; the feed starts the groups the new version lets in."""
        t_step = time.perf_counter()
        groups = await self.feed.step(self.step_no)
        mine = [g for g in range(len(groups)) if g % self.world.size == self.world.rank]
        sampled = [groups[g] for g in mine]
        return await self._train_on(self.step_no + 1, mine, sampled, time.perf_counter() - t_step, t_step)

    async def _train_on(
        self, step: int, mine: list[int], sampled: list[list[Trajectory]], rollout_s: float, t_step: float
    ) -> dict[str, Any]:
        """RoC, advantages, the update, the new weights to the engines and the step's metrics, on
        this process's groups ``mine`` (their rollouts ``sampled``; ``rollout_s``: the time the step
        waited for them)."""
        cfg, world = self.cfg, self.world
        trajs = [t for g in sampled for t in g]
        self._check_faults(trajs)
        if self.reward_fn is not None:
            for t in trajs:
                t.reward = float(self.reward_fn(t))  # a custom reward sees every rollout, truncated ones too

        S = cfg.rollout.samples
        groups = [[t for t in g if t.fault is None] for g in sampled]  # faults reach neither RoC nor the loss
        roc_cfg = as_dataclass(RocConfig, cfg.roc, keep=cfg.roc.keep if cfg.roc.enabled else S)
        r = cfg.roc
        scored = [[score(t, r.error_penalty, r.format_penalty, r.format_turns) for t in g] for g in groups]
        rngs = [random.Random(_seed(cfg.run.seed, step, g, 1)) for g in mine]  # by group, not by process
        choice = roc_select(scored, roc_cfg, rngs)
        kept_groups = [[g[i] for i in idx] for g, idx in zip(groups, choice.kept, strict=True)]
        advs = group_advantages(
            [[t.reward for t in g] for g in kept_groups], cfg.loss.adv_eps, cfg.loss.scale_by_std
        )
        rows = [
            Row(t, a, gi)
            for gi, (g, ad) in enumerate(zip(kept_groups, advs, strict=True))
            for t, a in zip(g, ad, strict=True)
        ]

        records = []
        for full, g, idx, sc in zip(sampled, groups, choice.kept, scored, strict=True):
            kept = {id(g[i]) for i in idx}
            penalties = {id(t): s for t, s in zip(g, sc, strict=True)}
            for t in full:
                s = penalties.get(id(t))
                records.append(_record(t, id(t) in kept, s.p_err if s else 0.0, s.p_format if s else 0.0))
                # RoC's penalties and choice (or the fault that left it out), for `rstar2 view`
                t.meta["roc"] = (
                    {"kept": id(t) in kept, "p_err": s.p_err, "p_format": s.p_format}
                    if s
                    else {"kept": False, "fault": t.fault}
                )
                t.meta["step"] = step
        if world.main and cfg.run.samples_per_step > 0:
            self._save_samples(step, sampled)
        all_records = [r for part in D.all_gather_objects(records, world) for r in part]
        roc_counts = D.all_sum([choice.metrics[k] for k in _ROC_COUNTS], world)
        self._check_versions([r.trajectory for r in rows], trained_by=step - 1)

        t1 = time.perf_counter()
        update = await asyncio.to_thread(D.on_device(world, self._update), rows, trajs)
        update_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        sync = await self._publish(step)
        sync_s = time.perf_counter() - t2

        self.step_no = step
        gen_tokens = sum(r["model_tokens"] for r in all_records)
        step_s = time.perf_counter() - t_step
        # synchronous: the rollouts' own rate; asynchronous, they overlap the update: per step's time
        per = step_s if cfg.rollout.max_staleness else rollout_s
        trained = [r.trajectory.model_versions for r in rows]
        lag = staleness_metrics(trained, trained_by=step - 1) if cfg.rollout.max_staleness else {}
        metrics = {
            **step_metrics(all_records),
            **dict(zip(_ROC_COUNTS, roc_counts, strict=True)),
            **update,
            **sync,
            **lag,
            "tokens_per_s": gen_tokens / per if per > 0 else 0.0,
            "time/rollout_s": rollout_s,
            "time/update_s": update_s,
            "time/sync_s": sync_s,
            "time/step_s": step_s,
        }
        t_then, then = self._counters
        self._counters = (time.perf_counter(), await read_counters(self.engines))
        metrics.update(engine_metrics(then, self._counters[1], self._counters[0] - t_then))
        self.warnings = self.watch.observe(step, metrics)
        metrics["health/warnings"] = float(len(self.warnings))
        if self.world.main:
            health.append_warnings(self.run_dir, self.warnings)
            for w in self.warnings:
                _say(f"[rstar2] warning: {w.message}")
        self.log.log(step, metrics)
        return metrics

    def _save_samples(self, step: int, groups: list[list[Trajectory]]) -> None:
        """The first groups of the step, whole, with RoC's penalties and choice (for ``rstar2 view``)."""
        folder = self.run_dir / "samples"
        folder.mkdir(parents=True, exist_ok=True)
        n, lines = 0, []
        for g in groups:
            if n >= self.cfg.run.samples_per_step:
                break
            lines += [json.dumps(t.to_dict()) for t in g]
            n += len(g)
        (folder / f"step_{step:06d}.jsonl").write_text("\n".join(lines) + "\n")

    def _progress(self, step: int, total: int) -> Callable[[Trajectory], None] | None:
        """A bar of ``step``'s ``total`` rollouts (the fed loop's groups of a step share one)."""
        if not (self.cfg.run.progress and self.world.main) or total < 2:
            return None
        bars = self._bars
        if step in bars:
            return bars[step]
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=f"rollouts step {step}", unit="traj", leave=False)

        def done(_: Trajectory) -> None:
            bar.update(1)
            if bar.n >= total:
                bar.close()
                bars.pop(step, None)

        bars[step] = done
        return done

    def _check_versions(self, trajs: list[Trajectory], trained_by: int) -> None:
        """Every token to train was sampled within ``rollout.max_staleness`` updates of the policy
        ``trained_by`` (rl/staleness.py); else the run stops before the update, on every process."""
        try:
            check_versions(trajs, trained_by=trained_by, max_staleness=self.cfg.rollout.max_staleness)
            said = None
        except StalenessError as exc:
            said = str(exc)
        first = next((x for x in D.all_gather_objects(said, self.world) if x), None)
        if first:
            raise StalenessError(first)

    def _check_faults(self, trajs: list[Trajectory]) -> None:
        """Stop when more than ``run.max_fault_share`` of the step's rollouts (all processes) were
        spoiled by the system (engine, code environment, verifier): a thin batch of survivors is no
        step to train on, and the cause needs a person."""
        failed = [t for t in trajs if t.fault is not None]
        n_failed, n_all = D.all_sum([len(failed), len(trajs)], self.world)
        if n_all and n_failed / n_all > self.cfg.run.max_fault_share:
            said = D.all_gather_objects(fault_message(failed[0]) if failed else None, self.world)
            first = next(v for v in said if v)
            raise RuntimeError(
                f"{int(n_failed)} of {int(n_all)} rollouts failed (more than run.max_fault_share="
                f"{self.cfg.run.max_fault_share}); the first: {first}"
            )

    def _update(self, rows: list[Row], trajs: list[Trajectory]) -> dict[str, Any]:
        """The update on the step's rows, in a worker thread; beside a decoding in-process engine
        (``max_staleness > 0``) the two split the torch threads (``rollout.engine_threads``)."""
        total, share = self.threads, self.cfg.rollout.engine_threads
        beside = self.cfg.rollout.max_staleness > 0 and not self.cfg.rollout.servers
        split = bool(beside and share and share < total)
        if split:
            for e in self.engines:
                e.threads = share
            torch.set_num_threads(total - share)
        try:
            return self._update_on(rows, trajs)
        finally:
            if split:
                torch.set_num_threads(total)
                for e in self.engines:
                    e.threads = None

    def _update_on(self, rows: list[Row], trajs: list[Trajectory]) -> dict[str, Any]:
        trim_heap()  # the rollouts' KV, freed: not under the update's peak (rstar2.memory)
        pad = self.tokenizer.pad_token_id or 0
        # a process without problems this step still joins every collective, with a zero-weight row
        stand_in = trajs[0] if trajs else Trajectory("", None, [pad], [pad], [0], [0.0])
        out = update_on_rollouts(
            self.run.learner,
            rows,
            stand_in,
            pad_id=pad,
            optim=self.cfg.optim,
            loss=self.cfg.loss,
            ref_model=self.ref_model,
            token_classes=self.token_classes,
            compute=self.cfg.model.compute,
            temperature=self.cfg.rollout.temperature,
            banned=self.rollout.banned_ids,
            off_policy=self.cfg.rollout.max_staleness > 0,
        )
        self.model.eval()
        trim_heap()  # the update's logits and activations, freed: not under the next rollouts' peak
        return out

    async def _publish(self, step: int) -> dict[str, float]:
        """New weights to the engines that do not share the trainer's model, checked (rl/sync.py)."""
        return await publish(
            self.model,
            self.engines,
            self.cfg.rollout,
            self.world,
            self.run_dir / "weights-latest",
            same_model=self.engine_model is self.model,
            probe_prompt=self.rollout.fmt.prompt_ids(PROBE_PROBLEM),
            pad_id=self.tokenizer.pad_token_id or 0,
            step=step,
            compute=self.cfg.model.compute,
        )


PROBE_PROBLEM = "What is 12 + 30?"  # the prompt each engine samples from after a weight sync
_ROC_COUNTS = ("roc/groups", "roc/groups_kept", "roc/groups_all_correct", "roc/groups_all_incorrect")

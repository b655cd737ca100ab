"""The RL trainer: one step = problems → 2G rollouts → rewards → RoC → advantages → update → sync.

With ``asynchronous.max_staleness: k > 0`` the groups of up to k steps ahead keep generating while
the trainer updates (the loss is then the decoupled objective, ``loss.tis_cap``); at k = 0 it is the
synchronous loop. Everything a step needs to be redone identically (sampling seeds, RoC's choices,
the data order) derives from (seed, step), so a resumed run continues exactly where it left off."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..chat.token_classes import TokenClasses
from ..config import RLConfig
from ..jsonl import write_jsonl
from ..memory import resident_gib, trim_heap
from ..problems import training_problems
from ..rollout import health
from ..rollout.multi_turn import CodeEnvironment, RewardFn, Verifier
from ..rollout.trajectory import Trajectory
from .algorithm.roc import Scored, roc_counts
from .algorithm.select import Selection, seed_of, select_rows
from .algorithm.staleness import StalenessError, check_versions, staleness_metrics
from .run import distributed as D
from .run.content_check import untrue_turn
from .run.data import DataStream
from .run.engine_mode import PROBE_PROBLEM, TrainerEngines, require_reported_versions
from .run.feed import GroupFeed
from .run.keep import KeptStep, keeping
from .run.launch import RunError, Steps, begin, load_reference, load_training, run_steps
from .run.step_metrics import engine_metrics, rollout_record, step_metrics
from .update import optimizer_steps, stand_in, update_on_rollouts


def load_reward(spec: str) -> RewardFn:
    """``"package.module:function"`` → the function (a custom reward for ``reward:`` in a config)."""
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


def has_spread(group: list[Trajectory]) -> bool:
    """Whether a group's unspoiled rollouts earned different rewards: only then is there an advantage."""
    return len({t.reward for t in group if t.fault is None}) > 1


def refill_order(rows: list[dict[str, Any]], cfg: RLConfig, position: int = 0) -> DataStream:
    """The problems that replace groups without a reward spread (``roc.refill_groups``): an order of
    their own, so the main order (and a resumed run's) does not depend on how many were needed."""
    return DataStream(rows, cfg.run.seed + 104_729, cfg.data.shuffle, position)


def task_of(problem: dict[str, Any]) -> dict[str, Any]:
    """A problem row's task for pass rates: a generated problem's family and level, a gym one's task."""
    family = problem.get("family") or (problem.get("gym") or {}).get("task")
    task = {"family": family} if family else {}
    return task if problem.get("level") is None else {**task, "level": problem["level"]}


def _say(line: str) -> None:
    """A line on stderr that does not break a progress bar."""
    tqdm.write(line, file=sys.stderr)


def fault_message(t: Trajectory) -> str:
    """What spoiled a rollout, in the system's words."""
    if t.fault == "sandbox":
        c = next(c for c in t.calls if c.fault)
        return f"code environment: {c.result.status}: {c.result.reason or c.result.stderr.strip()[-300:]}"
    return t.verdict


def causes(among: list[Trajectory], world: D.World, most: int = 8) -> str:
    """What spoiled ``among``, each cause once (the first ``most``, over every process: all call it)."""
    mine = list(dict.fromkeys(fault_message(t) for t in among))[:most]
    every = list(dict.fromkeys(c for part in D.all_gather_objects(mine, world) for c in part))
    return "; ".join(every[:most]) + (f"; and {len(every) - most} more" if len(every) > most else "")


def check_faults(trajs: list[Trajectory], cfg: RLConfig, world: D.World) -> None:
    """Stop when a rollout lost its engine after every retry (a dead server; training on the
    survivors would favour short rollouts), or when more than ``run.max_fault_share`` of the step's
    rollouts were spoiled by the system: a thin batch is no step, and the cause needs a person."""
    failed = [t for t in trajs if t.fault is not None]
    lost = [t for t in failed if t.meta.get("engine_lost")]
    n_failed, n_all, n_lost = D.all_sum([len(failed), len(trajs), len(lost)], world)
    if n_lost:
        raise RuntimeError(
            f"{int(n_lost)} of {int(n_all)} rollouts lost their engine after "
            f"rollout.scheduler.retries={cfg.rollout.scheduler.retries} retries; the step was "
            f"not trained (the survivors are not a fair sample): {causes(lost, world)}"
        )
    if n_all and (n_failed == n_all or n_failed / n_all > cfg.run.max_fault_share):  # none left: no step
        why = (
            "all of them" if n_failed == n_all else f"more than run.max_fault_share={cfg.run.max_fault_share}"
        )
        raise RuntimeError(
            f"{int(n_failed)} of {int(n_all)} rollouts failed ({why}): {causes(failed, world)}"
        )


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
    ):
        """``code_env``/``verifier``: running ones to use (and leave open) instead of ``cfg.rollout``'s."""
        self.cfg = cfg
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
        cfg = self.cfg
        start = begin(cfg, self.resume)
        self.world, self.tokenizer = start.world, start.tokenizer
        self.engines = TrainerEngines(cfg, self.world)
        window = cfg.run.reflection_window
        self.token_classes = TokenClasses(self.tokenizer, window) if window else None
        self.run = run = load_training(cfg, start, optimizer_steps(cfg), before_shard=self.engines.adopt)
        self.cfg = run.cfg
        self.model, self.log, self.step_no = run.learner.model, run.log, run.step
        self.first_step, self.first_position = run.step, run.data_position
        h = cfg.run.health
        self.watch = health.Watch({s: getattr(h, s) for s in health.SIGNS}, h.patience, h.stop)
        # every process continues the counts of the file the main one keeps
        kept = health.keep_warnings_until(self.run_dir, self.step_no, rewrite=self.world.main)
        self.watch.resume(kept, self.step_no)
        self.ref_model = load_reference(self.cfg, self.model, self.world) if cfg.needs_reference else None
        rows = training_problems(cfg.data)
        if self.world.main and any("gym" in r for r in rows):  # drawn here: kept with the run
            write_jsonl(rows, self.run_dir / "problems.jsonl")
        self.problems = DataStream(rows, cfg.run.seed, cfg.data.shuffle, run.data_position)
        self.refills = refill_order(rows, cfg, run.resumed.get("refill_position", 0))
        if cfg.uncorrected and self.world.main:
            _say(
                f"[rstar2] warning: asynchronous.max_staleness={cfg.asynchronous.max_staleness} without "
                "loss.tis_cap: stale tokens are trained as if on-policy (no correction)"
            )

    # -- the loop ----------------------------------------------------------------------------
    async def train(self) -> list[dict[str, Any]]:
        """Run the remaining steps; a failure is one ``RunError`` naming the step (``launch.run_steps``)."""
        from ..rollout.build import open_rollout

        self._load()
        history: list[dict[str, Any]] = []
        with run_steps("RL", self.cfg, self.run, self.cfg.run.steps) as steps:
            try:
                engines = await self.engines.open()
                async with open_rollout(
                    self.cfg.rollout,
                    tokenizer=self.tokenizer,
                    engines=engines,
                    reward=self.reward_fn,
                    **self.services,
                ) as rollout:
                    self.rollout = rollout
                    # a token without a reported version fails its engine, which serves again only
                    # once it holds the current weights (a server restarted mid-run holds its first)
                    rollout.require_versions = True
                    self.engines.attach(rollout.scheduler)
                    # every engine holds this run's weights and version before the first group starts (a
                    # server may hold another run's, or this one's past the checkpoint; a dead one fails here)
                    await self._publish(self.step_no)
                    require_reported_versions(self.engines.serving(), self.cfg.asynchronous.max_staleness)
                    self._counters = (time.perf_counter(), await self.engines.counters())
                    self.feed = GroupFeed(
                        self._launch_group,
                        first_step=self.step_no,
                        last_step=self.cfg.run.steps,
                        batch_size=self.cfg.run.batch_size,
                        max_staleness=self.cfg.asynchronous.max_staleness,
                    )
                    try:
                        await self._loop(steps, history)
                    finally:  # groups started for steps that will not run here (a resume redoes them)
                        await self.feed.close()
                        await rollout.scheduler.stop_reviving()
            finally:
                await self.engines.close()
        return history

    async def _loop(self, steps: Steps, history: list[dict[str, Any]]) -> None:
        """Each step, its checkpoint when due, and the stop a health limit asks for."""
        while self.step_no < self.cfg.run.steps:
            steps.begin(self.step_no + 1)
            metrics = await self.step()
            history.append(metrics)
            shown = {"acc": f"{metrics['accuracy']:.2f}", "loss": f"{metrics.get('loss', 0.0):.4f}"}
            stop = self.watch.stop_reason(self.warnings)
            if steps.done(self.step_no, **shown) or stop:
                # off the event loop: rollouts of later steps go on meanwhile
                await asyncio.to_thread(D.on_device(self.world, self.save), metrics)
            if stop:  # every process saw the same gathered records: all stop here
                raise RunError(f"RL step {self.step_no}: {stop} (run folder {self.run_dir})")

    def save(self, metrics: dict[str, Any]) -> Path:
        # the problems of the steps trained so far (the feed may have taken later steps' already)
        position = self.first_position + (self.step_no - self.first_step) * self.cfg.run.batch_size
        state = {"data_position": position, "refill_position": self.refills.position, "metrics": metrics}
        return self.run.save(self.step_no, state)

    # -- rollouts ----------------------------------------------------------------------------
    def _items(self, step: int, g: int, problem: dict[str, Any]) -> list[dict[str, Any]]:
        """Group ``g`` of ``step``'s rollouts, seeded by (seed, step, group, sample), whatever their order."""
        cfg = self.cfg
        return [
            {
                "problem": problem["problem"],
                "answer": str(problem["answer"]),
                "gym": problem.get("gym"),
                "seed": seed_of(cfg.run.seed, step, g, k),
                "priority": step,  # an engine short of rows serves earlier steps first
                "meta": {"group": g, "sample": k, **task_of(problem)},
            }
            for k in range(cfg.rollout.samples)
        ]

    def _launch_group(self, i: int) -> Awaitable[list[Trajectory]]:
        """Group ``i`` of the run, admitted now (in order): its problem taken, its rollouts started."""
        B = self.cfg.run.batch_size
        step, g = i // B + 1, i % B
        problem = self.problems.take(1)[0]
        if g % self.world.size != self.world.rank:  # another process's group
            return asyncio.sleep(0, result=[])
        own_groups = len(range(self.world.rank, B, self.world.size))
        on_done = self._progress(step, own_groups * self.cfg.rollout.samples)
        return self._group(self._items(step, g, problem), self.step_no, on_done)

    async def _group(
        self, items: list[dict[str, Any]], admitted: int, on_done: Callable[[Trajectory], None] | None = None
    ) -> list[Trajectory]:
        """One group's rollouts, rewarded, marked with the policy version that admitted them."""
        trajs = await self.rollout.run_many(items, on_done=on_done)
        for t in trajs:
            t.meta["admitted_version"] = admitted
        return trajs

    def _progress(self, step: int, total: int) -> Callable[[Trajectory], None] | None:
        """A bar of ``step``'s ``total`` rollouts (the groups of a step share one)."""
        if not (self.cfg.run.progress and self.world.main) or total < 2:
            return None
        if step not in self._bars:
            bar = tqdm(total=total, desc=f"rollouts step {step}", unit="traj", leave=False)

            def done(_: Trajectory) -> None:
                bar.update(1)
                if bar.n >= total:
                    bar.close()
                    self._bars.pop(step, None)

            self._bars[step] = done
        return self._bars[step]

    # -- one step ----------------------------------------------------------------------------
    async def step(self) -> dict[str, Any]:
        """One RL step, in order: rollouts → faults → RoC and advantages → version check → update →
        publish → metrics. The methods after it are plumbing a reader may skip."""
        cfg, step, t0 = self.cfg, self.step_no + 1, time.perf_counter()
        own, sampled = await self.rollouts()  # this process's groups, started up to k updates ago
        trajs = [t for g in sampled for t in g]
        rollout_s = time.perf_counter() - t0
        for t in trajs:  # tokens of a server that says it took weights it does not compute: none trains
            if t.fault is None and (why := untrue_turn(t, self.engines.untrue)):
                t.fault, t.verdict = "engine", why
        check_faults(trajs, cfg, self.world)  # a lost engine, or too many spoiled: no step

        chosen = select_rows(sampled, own, step, cfg)
        self._check_versions([row.trajectory for row in chosen.rows], trained_by=step - 1)

        t1 = time.perf_counter()
        pad = self.tokenizer.pad_token_id or 0
        update = await self.off_loop(
            self._keeping(step, sampled, own, chosen) if cfg.run.keep_steps else update_on_rollouts,
            self.run.learner,
            chosen.rows,
            stand_in(sampled, pad),  # no rows here: still in every collective
            cfg,
            pad_id=pad,
            banned=self.rollout.banned_ids,
            ref_model=self.ref_model,
            token_classes=self.token_classes,
            compute=cfg.model.compute,
        )
        t2 = time.perf_counter()
        sync = await self._publish(step)
        t3 = time.perf_counter()
        self.step_no = step
        times = {"rollout": rollout_s, "update": t2 - t1, "sync": t3 - t2, "step": t3 - t0}
        return await self.after_step(step, sampled, chosen, {**update, **sync}, times)

    def _keeping(
        self, step: int, sampled: list[list[Trajectory]], own: list[int], chosen: Selection
    ) -> Callable:
        """``update_on_rollouts`` that keeps what it consumed and made (``run.keep_steps``; run/keep.py)."""
        kept = KeptStep(
            step=step,
            cwd=os.getcwd(),  # where the config's relative paths start
            config=self.cfg.model_dump(mode="json"),
            precision=self.run.start.precision.resolved,
            group_ids=own,
            groups=sampled,
            choices=[c.kept for c in chosen.choices],
            advantages=[r.advantage for r in chosen.rows],
            world_size=self.world.size,
        )
        return keeping(update_on_rollouts, kept, self.run_dir, self.world.rank)

    async def rollouts(self) -> tuple[list[int], list[list[Trajectory]]]:
        """This process's groups of the next step (indices, rollouts), and their refills (``_refill``)."""
        groups = await self.feed.step(self.step_no)
        own = [g for g in range(len(groups)) if g % self.world.size == self.world.rank]
        sampled = [groups[g] for g in own]
        if self.cfg.roc.refill_groups:
            await self._refill(own, sampled)
        return own, sampled

    async def _refill(self, own: list[int], sampled: list[list[Trajectory]]) -> None:
        """Fresh groups, appended to ``own`` and ``sampled``, until ``run.batch_size`` groups of the step
        (over all processes) have a reward spread or ``roc.refill_groups`` were drawn (group ``B + j`` is
        process ``(B + j) % size``'s). Every process draws every extra problem: the same order on each."""
        B, step, world = self.cfg.run.batch_size, self.step_no + 1, self.world
        drawn = 0
        while True:
            spread = D.all_sum([sum(has_spread(g) for g in sampled)], world)[0]
            n = min(B - int(spread), self.cfg.roc.refill_groups - drawn)
            if n <= 0:
                return
            problems = self.refills.take(n)
            ids = range(B + drawn, B + drawn + n)
            mine = [(g, p) for g, p in zip(ids, problems, strict=True) if g % world.size == world.rank]
            own += [g for g, _ in mine]
            sampled += await asyncio.gather(
                *(self._group(self._items(step, g, p), self.step_no) for g, p in mine)
            )
            drawn += n

    async def off_loop(self, update: Callable[..., dict[str, Any]], *args: Any, **kw: Any) -> dict[str, Any]:
        """``update(*args, **kw)`` in a worker thread (later steps' rollouts go on meanwhile), the torch
        threads split with an engine copy (``beside_update``); the heap trimmed before and after, so
        the rollouts' KV and the update's activations never lie under each other's peak."""

        def run() -> dict[str, Any]:
            trim_heap()
            with self.engines.beside_update():
                out = update(*args, **kw)
            self.model.eval()
            trim_heap()
            return out

        return await asyncio.to_thread(D.on_device(self.world, run))

    async def after_step(
        self,
        step: int,
        sampled: list[list[Trajectory]],
        chosen: Selection,
        update: dict[str, float],
        times: dict[str, float],
    ) -> dict[str, Any]:
        """RoC's choice in each rollout's meta (for ``rstar2 view``), samples, metrics, health, the log."""
        records = []
        for full, g, c, sc in zip(sampled, chosen.groups, chosen.choices, chosen.scored, strict=True):
            scores: dict[int, Scored] = {id(t): s for t, s in zip(g, sc, strict=True)}
            kept_ids = {id(g[i]) for i in c.kept}
            for t in full:
                s, is_kept = scores.get(id(t)), id(t) in kept_ids
                records.append(rollout_record(t, is_kept, s))
                fault = {"kept": False, "fault": t.fault}
                t.meta["roc"] = {"kept": is_kept, "p_err": s.p_err, "p_format": s.p_format} if s else fault
                t.meta["step"] = step
        if self.world.main and self.cfg.run.samples_per_step > 0:
            self._save_samples(step, sampled)
        metrics = {**update, **await self._metrics(step, chosen, records, times)}
        self.warnings = self.watch.observe(step, metrics)
        metrics["health/warnings"] = float(len(self.warnings))
        if self.world.main:
            health.append_warnings(self.run_dir, self.warnings)
            for w in self.warnings:
                _say(f"[rstar2] warning: {w.message}")
        self.log.log(step, metrics)
        return metrics

    async def _metrics(
        self, step: int, chosen: Selection, records: list[dict[str, Any]], times: dict[str, float]
    ) -> dict[str, float]:
        """The step's metrics over all processes, and the engines' work since the last step."""
        world = self.world
        all_records = [r for part in D.all_gather_objects(records, world) for r in part]
        counts = roc_counts(chosen.choices)
        counts = dict(zip(counts, D.all_sum(list(counts.values()), world), strict=True))
        # the groups past the step's batch are those drawn for groups without a spread
        counts["groups/refilled"] = counts["roc/groups"] - self.cfg.run.batch_size
        gen_tokens = sum(r["model_tokens"] for r in all_records)
        # synchronous: the rollouts' own rate; asynchronous, they overlap the update: per step's time
        off_policy = self.cfg.asynchronous.off_policy
        per = times["step"] if off_policy else times["rollout"]
        trained = [r.trajectory.model_versions for r in chosen.rows]
        lag = staleness_metrics(trained, trained_by=step - 1) if off_policy else {}
        t_then, then = self._counters
        self._counters = (time.perf_counter(), await self.engines.counters())
        return {
            **step_metrics(all_records),
            **counts,
            **lag,
            "tokens_per_s": gen_tokens / per if per > 0 else 0.0,
            **{f"time/{k}_s": v for k, v in times.items()},
            **engine_metrics(then, self._counters[1], self._counters[0] - t_then),
            **resident_gib(),
        }

    def _save_samples(self, step: int, groups: list[list[Trajectory]]) -> None:
        """The first groups of the step, whole, with RoC's penalties and choice (for ``rstar2 view``)."""
        folder = self.run_dir / "samples"
        folder.mkdir(parents=True, exist_ok=True)
        lines: list[str] = []
        for g in groups:
            if len(lines) >= self.cfg.run.samples_per_step:
                break
            lines += [json.dumps(t.to_dict()) for t in g]
        (folder / f"step_{step:06d}.jsonl").write_text("\n".join(lines) + "\n")

    def _check_versions(self, trajs: list[Trajectory], trained_by: int) -> None:
        """Every token to train within ``max_staleness`` updates of ``trained_by``, else every rank stops."""
        refusal = None
        try:
            check_versions(trajs, trained_by=trained_by, max_staleness=self.cfg.asynchronous.max_staleness)
        except StalenessError as exc:
            refusal = str(exc)
        if first := next((x for x in D.all_gather_objects(refusal, self.world) if x), None):
            raise StalenessError(first)

    async def _publish(self, step: int) -> dict[str, float]:
        """New weights to the engines, checked (``TrainerEngines.publish``)."""
        probe = self.rollout.fmt.prompt_ids(PROBE_PROBLEM)
        folder = self.run_dir / "weights-latest"
        return await self.engines.publish(self.model, step, folder, probe, self.tokenizer.pad_token_id or 0)

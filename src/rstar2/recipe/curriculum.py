"""What a recipe's stage trains on: the problems of its sources and its generator, and the
curriculum read from the policy's own samples before the stage trains: the difficulty filter (the
problems it solves sometimes) and the ladder (the (family, level) cells in its reach, or each
family's next rung). ``sample`` is also what the recipe's evaluations sample with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..config import RolloutSection
from ..jsonl import write_jsonl
from ..problems import load_problems
from ..rollout.trajectory import read_trajectories
from ..tasks.generator import FAMILIES, Task, cells, generate
from .report_card import sampled_trajectories
from .spec import DataSpec, FilterSpec, GeneratorSpec, LadderSpec, StageSpec, stage_rollout
from .state import RecipeRun


def problem_rows(data: DataSpec, seed: int, split: str = "train") -> list[dict[str, Any]]:
    """The problems of ``data``: its sources', its reasoning-gym draw's, its generator's ``split``."""
    rows = [row for f in data.files for row in load_problems(f, data.columns)]
    rows += load_problems(data.gym) if data.gym is not None else []
    g = data.generator
    if g is not None:
        rows += [t.row() for t in generated(g, seed if g.seed is None else g.seed, split=split)]
    return rows[: data.limit]


def generated(
    g: GeneratorSpec, seed: int, *, split: str = "train", count: int | None = None, **narrow: Any
) -> list[Task]:
    """The problems of generator spec ``g``: ``count`` (default ``g.count``) of ``split``, in its
    wording (held-out problems always plain), with ``narrow`` (families, digits, levels) in place
    of the spec's own (a ladder cell)."""
    spec = {"families": g.families, "digits": g.digits, "levels": g.levels, "weights": g.weights} | narrow
    wording = g.wording if split == "train" else "plain"
    return generate(count or g.count, seed=seed, split=split, wording=wording, **spec)


async def sample(
    run: RecipeRun,
    settings: RolloutSection,
    model_dir: Path,
    rows: list[dict[str, Any]],
    out_dir: Path,
    *,
    samples: int,
    seed: int,
) -> dict:
    """``samples`` rollouts per problem through ``rstar2 eval``'s harness, in-process or on the
    recipe's servers once they have loaded ``model_dir``."""
    from ..engines.kinds import open_engines
    from ..eval.harness import evaluate
    from ..rl.run.sync import load_into_servers
    from ..rollout.build import open_rollout

    recipe, services = run.recipe, run.services
    out_dir.mkdir(parents=True, exist_ok=True)
    problems = write_jsonl(rows, out_dir / "problems.jsonl")
    engines = await open_engines(settings.engine, str(model_dir), recipe.model.device, recipe.model.dtype)
    try:
        taking = engines
        if settings.engine.servers:
            # version 0: the policy this sampling reads (an RL stage pushes its own start after); a
            # server that does not take it samples nothing here, while another did (else: stop)
            failed = await load_into_servers(engines, model_dir, settings.engine, version=0, drop_failed=True)
            for engine, why in failed:
                run.log(f"[rstar2] engine {engine.name} left out of this sampling: {why}")
            taking = [e for e in engines if e not in {f for f, _ in failed}]
        async with open_rollout(settings, tokenizer=str(model_dir), engines=taking, **services) as rollout:
            summaries = await evaluate(
                rollout, [str(problems)], out_dir, samples=samples, seed=seed, progress=run.progress
            )
    finally:
        for e in engines:
            await e.close()
    return summaries["problems"]


async def solved_counts(
    run: RecipeRun,
    stage: StageSpec,
    sampling: FilterSpec | LadderSpec,
    model_dir: Path,
    rows: list[dict],
    out_dir: Path,
    seed: int,
) -> list[int]:
    """How many of ``sampling.samples`` rollouts of the current policy solve each row, sampled as the
    stage samples (at ``sampling.temperature``): what the difficulty filter and the ladder read."""
    settings = stage_rollout(run.recipe, stage, temperature=sampling.temperature)
    await sample(run, settings, model_dir, rows, out_dir, samples=sampling.samples, seed=seed)
    trajs, _ = read_trajectories(sampled_trajectories(out_dir))
    solved = [0] * len(rows)
    for t in trajs:
        solved[t.meta["problem_index"]] += int(t.correct)
    return solved


async def filter_problems(
    run: RecipeRun, stage: StageSpec, flt: FilterSpec, model_dir: Path, rows: list[dict], out_dir: Path
) -> list[dict[str, Any]]:
    """The rows ``flt`` keeps (``FilterSpec``); ``filter.json`` records the solved counts."""
    solved = await solved_counts(run, stage, flt, model_dir, rows, out_dir, seed=run.recipe.seed + 17)
    top = flt.samples - 1 if flt.max_solved is None else flt.max_solved
    kept = [r for r, s in zip(rows, solved, strict=True) if flt.min_solved <= s <= top]
    summary = {
        "candidates": len(rows),
        "kept": len(kept),
        "solved_histogram": [solved.count(k) for k in range(flt.samples + 1)],
    }
    (out_dir / "filter.json").write_text(json.dumps(summary, indent=2))
    if not kept:
        raise ValueError(
            f"stage {stage.name}: the difficulty filter kept none of {len(rows)} problems "
            f"(solved counts {summary['solved_histogram']}); widen min_solved/max_solved or change the data"
        )
    return kept


def _cell_rows(g: GeneratorSpec, family: str, level: int, count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` training problems of one ladder cell (``tasks.cells``)."""
    size = {"digits": (level, level)} if family in FAMILIES else {"levels": (level, level)}
    return [t.row() for t in generated(g, seed, count=count, families=[family], **size)]


def choose_cells(grid: list[tuple[str, int]], rates: list[float]) -> tuple[list[int], list[str]]:
    """The ladder's cells, family by family: the levels solved sometimes (0 < rate < 1), else the
    lowest not yet always solved (the next rung: a family it cannot do yet is not dropped); a family
    solved at every level is left out (all cells if every one is). Also the families at a next rung."""
    chosen: list[int] = []
    rungs: list[str] = []
    for family in dict.fromkeys(f for f, _ in grid):
        by_level = sorted((lv, i) for i, (f, lv) in enumerate(grid) if f == family)
        in_reach = [i for lv, i in by_level if 0 < rates[i] < 1]
        if in_reach:
            chosen += in_reach
            continue
        unsolved = [i for lv, i in by_level if rates[i] < 1]
        if unsolved:
            chosen.append(unsolved[0])
            rungs.append(family)
    return (sorted(chosen), rungs) if chosen else (list(range(len(grid))), [])


def _drawn_equally(g: GeneratorSpec, chosen: list[tuple[str, int]], seed: int) -> list[dict[str, Any]]:
    """``g.count`` problems drawn equally from the ``chosen`` cells (the first ones one more where it
    does not divide), a problem drawn twice kept once."""
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for k, (family, level) in enumerate(chosen):
        share = g.count // len(chosen) + (k < g.count % len(chosen))
        for r in _cell_rows(g, family, level, share, seed):
            if r["problem"] not in seen:
                seen.add(r["problem"])
                rows.append(r)
    return rows


async def ladder_rows(
    run: RecipeRun, stage: StageSpec, model_dir: Path, out_dir: Path
) -> list[dict[str, Any]]:
    """The stage's problems by the difficulty ladder (``choose_cells``), recorded in ``ladder.json``."""
    spec, g = stage.ladder, stage.data.generator
    assert spec is not None and g is not None  # the stage's validator
    seed = run.recipe.seed if g.seed is None else g.seed
    grid = cells(g.families, g.digits, g.levels)
    probes: list[dict[str, Any]] = []
    for i, (family, level) in enumerate(grid):  # a seed of their own: not the problems then trained on
        probes += [{**r, "cell": i} for r in _cell_rows(g, family, level, spec.probes, seed + 7919)]
    per_probe = await solved_counts(run, stage, spec, model_dir, probes, out_dir, seed=run.recipe.seed + 23)
    solved = [0] * len(grid)
    for row, n in zip(probes, per_probe, strict=True):
        solved[row["cell"]] += n
    rates = [n / (spec.probes * spec.samples) for n in solved]
    chosen, rungs = choose_cells(grid, rates)
    rows = _drawn_equally(g, [grid[i] for i in chosen], seed)
    summary = {
        "cells": [
            {"family": f, "level": lv, "pass_rate": rate, "chosen": i in chosen}
            for i, ((f, lv), rate) in enumerate(zip(grid, rates, strict=True))
        ],
        "next_rung": rungs,  # families with no level in reach: their lowest level not always solved
        "problems": len(rows),
    }
    (out_dir / "ladder.json").write_text(json.dumps(summary, indent=2))
    run.log(
        f"[rstar2] ladder of {stage.name}: {len(chosen)} of {len(grid)} (family, level) cells, "
        f"{len(rungs)} families at their next rung (none in reach), {len(rows)} problems"
    )
    return rows

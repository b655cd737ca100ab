"""Running a recipe: the model, then each stage in order, an evaluation after each, a report.

A stage's data is written into the run folder before it trains (generated problems, SFT
conversations with real tool outputs, or the problems a difficulty filter kept), its checkpoint
starts the next stage, and ``recipe_state.json`` records finished stages, so ``--resume`` skips
them and continues the interrupted one from its last checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..config import NO_TOOLS, RolloutSection, dump_config, parse_config
from ..device import pick_device, record, resolve_precision
from ..jsonl import read_jsonl, write_jsonl
from ..memory import release_memory
from .spec import (
    PROBE_FILE,
    DataSpec,
    EvalSpec,
    FilterSpec,
    GeneratorSpec,
    Recipe,
    StageSpec,
    stage_rollout,
    stage_tree,
)
from .tasks import FAMILIES, Task, cells, generate

STATE_FILE = "recipe_state.json"


# -- model --------------------------------------------------------------------------------------
def prepare_model(recipe: Recipe, out: Path) -> Path:
    """The starting model directory: ``model.path``, a model imported from ``model.source``, or a
    tiny tokenizer + model built here (both written once into ``out/model-init``)."""
    m = recipe.model
    if m.path:
        return Path(m.path)
    target = out / "model-init"
    if (target / "config.json").exists():
        return target
    if m.source:
        from ..importer import import_model

        import_model(m.source, target)
        return target
    from .corpus import tiny_corpus
    from .tiny_model import build_model, build_tokenizer, save_pretrained

    tok = build_tokenizer(tiny_corpus(recipe), m.vocab)
    model = build_model(
        tok,
        hidden=m.hidden,
        layers=m.layers,
        heads=m.heads,
        mlp=m.mlp,
        max_positions=m.max_positions,
        seed=recipe.seed,
    )
    tmp = out / "model-init.tmp"
    save_pretrained(model, tok, tmp)
    tmp.replace(target)
    return target


# -- data ---------------------------------------------------------------------------------------
def problem_rows(data: DataSpec, seed: int, split: str = "train") -> list[dict[str, Any]]:
    from ..problems import load_benchmark

    rows: list[dict[str, Any]] = []
    for f in data.files:
        rows += load_benchmark(f)  # a JSONL path or a shipped benchmark's name
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
    spec = {"families": g.families, "digits": g.digits, "levels": g.levels} | narrow
    wording = g.wording if split == "train" else "plain"
    return generate(count or g.count, seed=seed, split=split, wording=wording, **spec)


async def sft_rows(
    recipe: Recipe, data: DataSpec, code_env: Any, progress: bool = False, what: str = "SFT data"
) -> list[dict[str, Any]]:
    from tqdm.auto import tqdm

    from .sft_data import build_conversations

    rows: list[dict[str, Any]] = []
    for f in data.files:
        rows += read_jsonl(f)
    g = data.generator
    if g is not None:
        seed = recipe.seed if g.seed is None else g.seed
        tasks = generated(g, seed)
        bar = tqdm(total=len(tasks), desc=f"{what} (real tool runs)", unit="conv", disable=not progress)
        rows += await build_conversations(
            tasks,
            code_env,
            system_prompt=recipe.chat.system_prompt,
            user_prefix=recipe.chat.user_prefix,
            error_rate=g.error_rate,
            tool_limit_chars=recipe.chat.tool_limit_chars,
            traceback_lines=recipe.chat.tool_traceback_lines,
            seed=seed,
            on_done=lambda: bar.update(1),
        )
        bar.close()
    return rows[: data.limit]


async def _sample(
    recipe: Recipe,
    settings: RolloutSection,
    model_dir: Path,
    rows: list[dict[str, Any]],
    out_dir: Path,
    *,
    samples: int,
    seed: int,
    services: dict,
    progress: bool,
) -> dict:
    """Eval-style sampling through ``rstar2 eval``'s harness: ``samples`` rollouts per problem, on
    the in-process engine over ``model_dir`` (on ``model.device``) or on the recipe's servers once
    they have loaded it."""
    from ..eval.harness import evaluate
    from ..rl.sync import load_into_servers
    from ..rollout.build import open_engines, open_rollout

    out_dir.mkdir(parents=True, exist_ok=True)
    problems = write_jsonl(rows, out_dir / "problems.jsonl")
    engines = await open_engines(settings, str(model_dir), recipe.model.device, recipe.model.dtype)
    try:
        if settings.servers:
            # version 0: the policy this sampling reads (an RL stage pushes its own start after)
            await load_into_servers(engines, model_dir, settings, version=0)
        async with open_rollout(settings, tokenizer=str(model_dir), engines=engines, **services) as rollout:
            summaries = await evaluate(
                rollout, [str(problems)], out_dir, samples=samples, seed=seed, progress=progress
            )
    finally:
        for e in engines:
            await e.close()
    return summaries["problems"]


async def solved_counts(
    recipe: Recipe,
    stage: StageSpec,
    temperature: float,
    model_dir: Path,
    rows: list[dict],
    out_dir: Path,
    samples: int,
    seed: int,
    services: dict,
    progress: bool,
) -> list[int]:
    """How many of ``samples`` rollouts of the current policy solve each row, sampled as the stage
    samples (its settings, at ``temperature``): what the difficulty filter and the ladder read."""
    from ..rollout.trajectory import read_trajectories
    from .report_card import sampled_trajectories

    settings = stage_rollout(recipe, stage, temperature=temperature)
    await _sample(
        recipe,
        settings,
        model_dir,
        rows,
        out_dir,
        samples=samples,
        seed=seed,
        services=services,
        progress=progress,
    )
    trajs, _ = read_trajectories(sampled_trajectories(out_dir))
    solved = [0] * len(rows)
    for t in trajs:
        solved[t.meta["problem_index"]] += int(t.correct)
    return solved


async def filter_problems(
    recipe: Recipe,
    stage: StageSpec,
    flt: FilterSpec,
    model_dir: Path,
    rows: list[dict],
    out_dir: Path,
    services: dict,
    progress: bool,
) -> list[dict[str, Any]]:
    """The problems the current policy solves between ``min_solved`` and ``max_solved`` times of
    ``samples`` (the paper's last stage keeps those not solved every time)."""
    solved = await solved_counts(
        recipe,
        stage,
        flt.temperature,
        model_dir,
        rows,
        out_dir,
        flt.samples,
        recipe.seed + 17,
        services,
        progress,
    )
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
    """``count`` training problems of one ladder cell (an arithmetic family's digits, a relation
    family's steps)."""
    size = {"digits": (level, level)} if family in FAMILIES else {"levels": (level, level)}
    return [t.row() for t in generated(g, seed, count=count, families=[family], **size)]


def choose_cells(grid: list[tuple[str, int]], rates: list[float]) -> tuple[list[int], list[str]]:
    """The ladder's cells to train on, family by family: the levels the policy solves sometimes
    (0 < rate < 1); a family with none of those climbs from its lowest level not yet always solved
    (the next rung: a family it cannot do yet is not dropped); a family solved at every level is left
    out (all cells if every family is). Returns the cells and the families taken at their next rung."""
    chosen: list[int] = []
    rungs: list[str] = []
    for family in dict.fromkeys(f for f, _ in grid):
        mine = sorted((lv, i) for i, (f, lv) in enumerate(grid) if f == family)
        in_reach = [i for lv, i in mine if 0 < rates[i] < 1]
        if in_reach:
            chosen += in_reach
            continue
        unsolved = [i for lv, i in mine if rates[i] < 1]
        if unsolved:
            chosen.append(unsolved[0])
            rungs.append(family)
    return (sorted(chosen), rungs) if chosen else (list(range(len(grid))), [])


async def ladder_rows(
    recipe: Recipe,
    stage: StageSpec,
    model_dir: Path,
    out_dir: Path,
    services: dict,
    progress: bool,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """The difficulty ladder (``stage.ladder``): the current policy's pass rate on each (family,
    level) cell of the stage's generator, then the stage's problems drawn equally from the cells
    ``choose_cells`` takes (the levels solved sometimes, else a family's next rung);
    ``ladder.json`` records the rates and the choice."""

    spec, g = stage.ladder, stage.data.generator
    assert spec is not None and g is not None  # the stage's validator
    seed = recipe.seed if g.seed is None else g.seed
    grid = cells(g.families, g.digits, g.levels)
    probes: list[dict[str, Any]] = []
    for i, (family, level) in enumerate(grid):
        # probes of their own seed: the policy is measured on problems it is not then trained on by design
        probes += [{**r, "cell": i} for r in _cell_rows(g, family, level, spec.probes, seed + 7919)]
    per_probe = await solved_counts(
        recipe,
        stage,
        spec.temperature,
        model_dir,
        probes,
        out_dir,
        spec.samples,
        recipe.seed + 23,
        services,
        progress,
    )
    solved = [0] * len(grid)
    for row, n in zip(probes, per_probe, strict=True):
        solved[row["cell"]] += n
    rates = [n / (spec.probes * spec.samples) for n in solved]
    chosen, rungs = choose_cells(grid, rates)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for k, i in enumerate(chosen):
        family, level = grid[i]
        share = g.count // len(chosen) + (k < g.count % len(chosen))
        for r in _cell_rows(g, family, level, share, seed):
            if r["problem"] not in seen:
                seen.add(r["problem"])
                rows.append(r)
    summary = {
        "cells": [
            {"family": f, "level": lv, "pass_rate": rate, "chosen": i in chosen}
            for i, ((f, lv), rate) in enumerate(zip(grid, rates, strict=True))
        ],
        "next_rung": rungs,  # families with no level in reach: their lowest level not always solved
        "problems": len(rows),
    }
    (out_dir / "ladder.json").write_text(json.dumps(summary, indent=2))
    log(
        f"[rstar2] ladder of {stage.name}: {len(chosen)} of {len(grid)} (family, level) cells, "
        f"{len(rungs)} families at their next rung (none in reach), {len(rows)} problems"
    )
    return rows


async def stage_data(
    recipe: Recipe,
    stage: StageSpec,
    model_dir: Path,
    stage_dir: Path,
    services: dict,
    progress: bool,
    log: Callable[[str], None] = print,
) -> Path:
    """The stage's training file, written once (a resumed run reuses it)."""
    path = stage_dir / "train.jsonl"
    if path.exists():
        return path
    if stage.probe is not None:  # written first: a resumed run has it whenever it has train.jsonl
        probe = await sft_rows(recipe, stage.probe, services["code_env"], progress, "SFT probe")
        write_jsonl(probe, stage_dir / PROBE_FILE)
    if stage.kind == "sft":
        rows = await sft_rows(recipe, stage.data, services["code_env"], progress)
    elif stage.ladder is not None:  # the files as given, the generator's problems from the cells in reach
        files = problem_rows(DataSpec(files=stage.data.files), recipe.seed) if stage.data.files else []
        ladder = await ladder_rows(recipe, stage, model_dir, stage_dir / "ladder", services, progress, log)
        rows = (files + ladder)[: stage.data.limit]
    else:
        rows = problem_rows(stage.data, recipe.seed)
    if stage.kind == "rl" and stage.filter is not None:
        rows = await filter_problems(
            recipe, stage, stage.filter, model_dir, rows, stage_dir / "filter", services, progress
        )
    if not rows:
        raise ValueError(f"stage {stage.name}: no training data")
    return write_jsonl(rows, path)


# -- evaluation ---------------------------------------------------------------------------------
def eval_rows(recipe: Recipe) -> list[dict[str, Any]]:
    spec = recipe.eval
    if spec.data is not None:
        return problem_rows(spec.data, recipe.seed, split="heldout")
    gens = [s.data.generator for s in recipe.stages if s.kind == "rl" and s.data.generator is not None]
    if not gens:
        return []
    seed = recipe.seed if spec.seed is None else spec.seed
    return [t.row() for t in generated(gens[0], seed, split="heldout", count=spec.count)]


async def evaluate_model(
    recipe: Recipe,
    model_dir: Path,
    rows: list[dict],
    out_dir: Path,
    services: dict,
    progress: bool,
    plain: bool = False,
) -> dict:
    """``plain``: the zero-shot baseline without the tool format (``config.NO_TOOLS``)."""
    spec: EvalSpec = recipe.eval
    has_rl = any(s.kind == "rl" for s in recipe.stages)
    base = stage_rollout(recipe)  # the last RL stage's settings: held-out scores as training samples
    overrides = {
        "temperature": spec.temperature,
        "max_turns": spec.max_turns or (base.max_turns if has_rl else 4),
        "max_response_tokens": spec.max_response_tokens or (base.max_response_tokens if has_rl else 1024),
    }
    settings = stage_rollout(recipe, **{**overrides, **(NO_TOOLS if plain else {})})
    return await _sample(
        recipe,
        settings,
        model_dir,
        rows,
        out_dir,
        samples=spec.samples,
        seed=recipe.seed + 1,
        services=services,
        progress=progress,
    )


# -- the run ------------------------------------------------------------------------------------
def _state(out: Path) -> dict[str, Any]:
    p = out / STATE_FILE
    return json.loads(p.read_text()) if p.exists() else {"stages": {}, "evals": {}}


def _save_state(out: Path, state: dict[str, Any]) -> None:
    tmp = out / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(out / STATE_FILE)


async def train_stage(cfg, resume: bool, services: dict) -> bool:
    """Run one stage's trainer; returns whether it stopped early (SFT's ``stop_loss``/``stop_skill``)."""
    if cfg.kind == "sft":
        from ..rl.sft import SFTTrainer

        trainer = SFTTrainer(cfg, resume=resume)
        await asyncio.to_thread(trainer.train)
        return trainer.stopped_early
    from ..rl.trainer import RLTrainer

    await RLTrainer(cfg, resume=resume, **services).train()
    return False


def run_recipe(
    recipe: Recipe,
    out: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> Path:
    """Run every stage; returns the report's path."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per weight load would drown the stage bars
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError(
            "a recipe runs in one process; under torchrun, run a stage's config.yaml with `rstar2 train`"
        )
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not resume:
        raise ValueError(f"{out} is not empty: pass --resume to continue that run, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    return asyncio.run(_run(recipe, out, resume, progress, log))


def run_named(
    name: str,
    out: str | None,
    resume: bool,
    overrides: list[str],
    progress: bool,
    log: Callable[[str], None] = print,
) -> str:
    """``rstar2 train --recipe`` and ``rstar2 demo``: a shipped recipe's name or a YAML path, run
    into ``out`` (default ``runs/NAME``); returns what the command ends with: the evaluation
    table, the RL gain and the report's path."""
    from .report_card import table
    from .spec import find_recipe, load_recipe

    recipe = load_recipe(find_recipe(name), overrides)
    out_dir = Path(out or f"runs/{recipe.name}")
    report = run_recipe(recipe, out_dir, resume=resume, progress=progress, log=log)
    state = json.loads((out_dir / STATE_FILE).read_text())
    gain = json.loads((out_dir / "report.json").read_text()).get("rl_gain")
    return "\n".join([table(state.get("evals", {})), *([gain] if gain else []), f"report: {report}"])


@asynccontextmanager
async def open_services(recipe: Recipe) -> AsyncIterator[dict[str, Any]]:
    """One code environment and one verifier pool for the whole run (starting them per stage and
    per evaluation costs more than a tiny stage)."""
    from ..rollout.build import open_services as open_rollout_services

    async with open_rollout_services(stage_rollout(recipe)) as services:
        yield services


async def _run(recipe: Recipe, out: Path, resume: bool, progress: bool, log: Callable[[str], None]) -> Path:
    """The run; a failure becomes a ``RunError`` naming the part of the recipe it happened in (the
    traceback in ``error.txt``); the folder keeps every finished stage for ``--resume``."""
    from ..rl.launch import RunError, write_error

    where = ["set-up"]
    try:
        with on_local_vllm(recipe, out, log) as recipe:
            return await _stages(recipe, out, resume, progress, log, where)
    except Exception as exc:
        write_error(out, exc)
        raise RunError.at(f"recipe {recipe.name}, {where[0]}", out, exc) from exc


@contextmanager
def on_local_vllm(recipe: Recipe, out: Path, log: Callable[[str], None]) -> Iterator[Recipe]:
    """The recipe as it samples: with ``vllm:``, on a vLLM server started for the run on its
    starting model (``out/vllm.log`` keeps its output) and stopped after; else as it is."""
    from ..engines import vllm_launch

    spec = recipe.vllm
    if spec is None:
        yield recipe
        return
    if not vllm_launch.installed():
        if not spec.if_installed:
            raise RuntimeError("the recipe asks for vllm: but vLLM is not installed (scripts/setup-vllm.sh)")
        log("[rstar2] vLLM is not installed (scripts/setup-vllm.sh): sampling in-process")
        yield recipe.model_copy(update={"vllm": None})
        return
    model = prepare_model(recipe, out)
    log(f"[rstar2] starting vLLM on {model} (cores {spec.cores or 'all'}; its log: {out / 'vllm.log'})")
    options = spec.model_dump(exclude={"if_installed"})
    with vllm_launch.local_server(model, out / "vllm.log", **options) as url:
        yield recipe.model_copy(update={"servers": [url], "vllm": None})


async def _stages(
    recipe: Recipe, out: Path, resume: bool, progress: bool, log: Callable[[str], None], where: list[str]
) -> Path:
    from ..rl.checkpoint import latest_checkpoint
    from .report_card import eval_dir, sampled_trajectories, write_report

    precision = resolve_precision(pick_device(recipe.model.device), recipe.model.compute)
    log(f"[rstar2] recipe {recipe.name}: {precision.describe()}")
    (out / "recipe.yaml").write_text(record(precision) + dump_config(recipe))
    state = _state(out)
    state["precision"] = asdict(precision)
    current = prepare_model(recipe, out)
    held_out = eval_rows(recipe)
    if held_out:
        write_jsonl(held_out, out / "heldout.jsonl")
    also = {name: problem_rows(DataSpec(files=[name]), recipe.seed) for name in recipe.eval.also}
    state.setdefault("also", {name: {} for name in also})

    async def evaluate(label: str, index: int, model: Path, plain: bool = False, sets: bool = False) -> None:
        """The held-out problems (and, with ``sets``, every ``eval.also`` set), once per label."""
        where[0] = f"evaluation {label}"
        if held_out and label not in state["evals"]:
            state["evals"][label] = await evaluate_model(
                recipe, model, held_out, eval_dir(out, index, label), services, progress, plain
            )
            _save_state(out, state)
            release_memory()
        for name, rows in also.items() if sets else []:
            if label not in state["also"][name]:
                folder = eval_dir(out, index, f"{label}-{Path(name).stem}")
                state["also"][name][label] = await evaluate_model(
                    recipe, model, rows, folder, services, progress, plain
                )
                _save_state(out, state)
                release_memory()

    async with open_services(recipe) as services:
        if recipe.eval.before:
            log("[rstar2] evaluating the starting model")
            await evaluate("start", 0, current, sets=True)
        if recipe.eval.plain_before:
            log("[rstar2] evaluating the starting model plain (no tools, lenient)")
            await evaluate("start-plain", 0, current, plain=True, sets=True)
        for n, stage in enumerate(recipe.stages, 1):
            stage_dir = out / f"{n:02d}-{stage.name}"
            done = state["stages"].get(stage.name)
            if done:
                current = Path(done["checkpoint"])
                continue
            log(f"[rstar2] stage {n}/{len(recipe.stages)}: {stage.name} ({stage.kind})")
            stage_dir.mkdir(parents=True, exist_ok=True)
            where[0] = f"stage {stage.name} ({n}/{len(recipe.stages)}): its data"
            train = await stage_data(recipe, stage, current, stage_dir, services, progress, log)
            tree = stage_tree(recipe, stage, model_path=str(current), train=str(train), out=str(stage_dir))
            tree["run"]["progress"] = progress
            if n > 1 and recipe.stages[n - 2].kind == stage.kind:
                # RL after RL continues the optimizer (unless the stage resets it); RL after SFT starts fresh
                tree["run"]["init_from"] = str(current)
            where[0] = f"stage {stage.name} ({n}/{len(recipe.stages)})"
            stopped = await train_stage(parse_config(tree), resume, services)
            release_memory()
            ckpt = latest_checkpoint(stage_dir)
            if ckpt is None:
                raise RuntimeError(f"stage {stage.name} ended without a checkpoint in {stage_dir}")
            current = ckpt
            state["stages"][stage.name] = {
                "checkpoint": str(ckpt),
                "kind": stage.kind,
                "steps": int(ckpt.name.split("-")[-1]),  # the stage's steps, a resumed part included
                "stopped_early": stopped,
            }
            _save_state(out, state)
            # the eval.also sets after SFT too: the report pairs them with the final model's
            await evaluate(stage.name, n, current, sets=stage.kind == "sft")
        last = recipe.stages[-1]
        await evaluate(last.name, len(recipe.stages), current, sets=True)
    held_out_trajs = sampled_trajectories(eval_dir(out, len(recipe.stages), last.name))
    if recipe.eval.entropy_trajectories and held_out_trajs.exists() and state.get("entropy") != str(current):
        # `rstar2 analyze entropy` of the final model on its own held-out trajectories (once per model)
        from ..analysis.entropy_report import analyze

        where[0] = "entropy analysis of the final model"
        log(f"[rstar2] token entropy of the final model on its held-out trajectories ({last.name})")
        analyze(
            current,
            held_out_trajs,
            out / "entropy",
            limit=recipe.eval.entropy_trajectories,
            progress=progress,
        )
        state["entropy"] = str(current)
        _save_state(out, state)
    return write_report(out, recipe, state)

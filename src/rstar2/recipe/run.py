"""Running a recipe: the model, then each stage in order, an evaluation after each, a report. A
stage's data is written into the run folder before it trains, its checkpoint starts the next stage,
and ``recipe_state.json`` records finished stages, so ``--resume`` skips them and continues the
interrupted one from its last checkpoint."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..config import NO_TOOLS
from ..config_files import dump_config, parse_config
from ..device import pick_device, record, resolve_precision
from ..jsonl import read_jsonl, write_jsonl
from ..memory import release_memory
from ..problems import source_name
from .curriculum import filter_problems, generated, ladder_rows, problem_rows, sample
from .report_card import eval_dir, sampled_trajectories, table, write_report
from .spec import PROBE_FILE, DataSpec, Recipe, StageSpec, eval_rollout, stage_rollout, stage_tree
from .state import STATE_FILE, RecipeRun


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
    from .tiny_model import SHAPE, build_model, build_tokenizer, save_pretrained, tiny_corpus

    tok = build_tokenizer(tiny_corpus(recipe), m.vocab)
    model = build_model(tok, seed=recipe.seed, **m.model_dump(include=SHAPE))
    tmp = out / "model-init.tmp"
    save_pretrained(model, tok, tmp)
    tmp.replace(target)
    return target


# -- data ---------------------------------------------------------------------------------------
async def sft_rows(run: RecipeRun, data: DataSpec, what: str = "SFT data") -> list[dict[str, Any]]:
    from tqdm.auto import tqdm

    from .sft_data import build_conversations

    rows = [row for f in data.files for row in read_jsonl(f)]
    g = data.generator
    if g is not None:
        seed = run.recipe.seed if g.seed is None else g.seed
        tasks = generated(g, seed)
        bar = tqdm(total=len(tasks), desc=f"{what} (real tool runs)", unit="conv", disable=not run.progress)
        code_env, chat = run.services["code_env"], run.recipe.chat
        rows += await build_conversations(
            tasks, code_env, chat, error_rate=g.error_rate, seed=seed, on_done=bar.update
        )
        bar.close()
    return rows[: data.limit]


async def stage_data(run: RecipeRun, stage: StageSpec, model_dir: Path, stage_dir: Path) -> Path:
    """The stage's training file, written once (a resumed run reuses it)."""
    path = stage_dir / "train.jsonl"
    if path.exists():
        return path
    if stage.probe is not None:  # written first: a resumed run has it whenever it has train.jsonl
        write_jsonl(await sft_rows(run, stage.probe, "SFT probe"), stage_dir / PROBE_FILE)
    seed = run.recipe.seed
    if stage.kind == "sft":
        rows = await sft_rows(run, stage.data)
    elif stage.ladder is not None:  # files and gym as given, the generator's problems from the cells in reach
        given = problem_rows(stage.data.model_copy(update={"generator": None, "limit": None}), seed)
        ladder = await ladder_rows(run, stage, model_dir, stage_dir / "ladder")
        rows = (given + ladder)[: stage.data.limit]
    else:
        rows = problem_rows(stage.data, seed)
    if stage.kind == "rl" and stage.filter is not None:
        rows = await filter_problems(run, stage, stage.filter, model_dir, rows, stage_dir / "filter")
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
    run: RecipeRun, model_dir: Path, rows: list[dict], out_dir: Path, plain: bool = False
) -> dict:
    """``model_dir`` on ``rows`` as ``eval_rollout`` says (``rstar2 eval``'s rule); ``plain``: the
    zero-shot baseline without the tool format (``config.NO_TOOLS``)."""
    recipe = run.recipe
    settings = eval_rollout(recipe, **(NO_TOOLS if plain else {}))
    samples = recipe.eval.samples
    return await sample(run, settings, model_dir, rows, out_dir, samples=samples, seed=recipe.seed + 1)


async def _evaluate(
    run: RecipeRun,
    label: str,
    index: int,
    model: Path,
    held_out: list[dict],
    also: dict[str, list[dict]],
    plain: bool = False,
) -> None:
    """``model`` on the held-out problems and on each ``also`` set (``eval.also``: a name and its
    rows) where the recipe evaluates them at that point (``eval.heldout_at``, ``eval.also_at``),
    once per label: each result saved in the run's state as it is done."""
    run.where = f"evaluation {label}"
    heldout_here, also_here = run.recipe.evaluated_at("start" if index == 0 else label)
    todo = [(run.state["evals"], label, held_out)] if held_out and heldout_here else []
    todo += [
        (run.state["also"][name], f"{label}-{source_name(name)}", rows)
        for name, rows in (also.items() if also_here else ())
    ]
    for done, folder, rows in todo:
        if label not in done:
            done[label] = await evaluate_model(run, model, rows, eval_dir(run.out, index, folder), plain)
            run.save_state()
            release_memory()


# -- the run ------------------------------------------------------------------------------------
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
    """Run every stage; returns the report's path. A failure becomes a ``RunError`` naming the part
    of the recipe (the traceback in ``error.txt``); the folder keeps every finished stage."""
    from transformers.utils import logging as hf_logging

    from ..rl.run.launch import RunError, write_error

    hf_logging.disable_progress_bar()  # one bar per weight load would drown the stage bars
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError(
            "a recipe runs in one process; under torchrun, run a stage's config.yaml with `rstar2 train`"
        )
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not resume:
        raise ValueError(f"{out} is not empty: pass --resume to continue that run, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    run = RecipeRun(recipe, out, progress, log)
    try:
        with on_local_vllm(recipe, out, log) as run.recipe:
            return asyncio.run(_stages(run, resume))
    except Exception as exc:
        write_error(out, exc)
        raise RunError.at(f"recipe {recipe.name}, {run.where}", out, exc) from exc


def run_named(
    name: str,
    out: str | None,
    resume: bool,
    overrides: list[str],
    progress: bool,
    log: Callable[[str], None] = print,
) -> str:
    """``rstar2 train --recipe`` and ``rstar2 demo``: a recipe run into ``out`` (default ``runs/NAME``);
    returns the evaluation table, the RL gain and the report's path."""
    from .spec import find_recipe, load_recipe

    recipe = load_recipe(find_recipe(name), overrides)
    out_dir = Path(out or f"runs/{recipe.name}")
    report = run_recipe(recipe, out_dir, resume=resume, progress=progress, log=log)
    state = json.loads((out_dir / STATE_FILE).read_text())
    gain = json.loads((out_dir / "report.json").read_text()).get("rl_gain")
    return "\n".join([table(state.get("evals", {})), *([gain] if gain else []), f"report: {report}"])


def adapter_rank(recipe: Recipe) -> int | None:
    """The largest adapter rank of the recipe's RL stages (what its engines load at run time)."""
    stages = [parse_config(stage_tree(recipe, s, model_path="-", train="-", out="-")) for s in recipe.stages]
    return max(
        (s.model.lora.rank for s in stages if s.kind == "rl" and s.model.lora is not None), default=None
    )


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
    options["lora_rank"] = adapter_rank(recipe)  # its RL stages' adapters load at run time
    with vllm_launch.local_server(model, out / "vllm.log", weights_from=[out, model], **options) as url:
        engine = {**(recipe.rollout.get("engine") or {}), "servers": [url]}
        yield recipe.model_copy(update={"rollout": {**recipe.rollout, "engine": engine}, "vllm": None})


async def _stages(run: RecipeRun, resume: bool) -> Path:
    """The stages not yet finished, the evaluations, the final model's token entropy, the report."""
    from ..rollout.build import open_services

    recipe, out = run.recipe, run.out
    precision = resolve_precision(pick_device(recipe.model.device), recipe.model.compute)
    run.log(f"[rstar2] recipe {recipe.name}: {precision.describe()}")
    (out / "recipe.yaml").write_text(record(precision) + dump_config(recipe))
    state_file = out / STATE_FILE
    run.state = json.loads(state_file.read_text()) if state_file.exists() else {"stages": {}, "evals": {}}
    run.state["precision"] = asdict(precision)
    current = prepare_model(recipe, out)
    held_out = eval_rows(recipe)
    if held_out:
        write_jsonl(held_out, out / "heldout.jsonl")
    also = {name: problem_rows(DataSpec(files=[name]), recipe.seed) for name in recipe.eval.also}
    run.state.setdefault("also", {name: {} for name in also})
    # one code environment and verifier pool for the whole run: per stage they cost more than a tiny stage
    async with open_services(stage_rollout(recipe)) as run.services:
        if recipe.eval.before:
            run.log("[rstar2] evaluating the starting model")
            await _evaluate(run, "start", 0, current, held_out, also)
        if recipe.eval.plain_before:
            run.log("[rstar2] evaluating the starting model plain (no tools, lenient)")
            await _evaluate(run, "start-plain", 0, current, held_out, also, plain=True)
        for n, stage in enumerate(recipe.stages, 1):
            done = run.state["stages"].get(stage.name)
            current = Path(done["checkpoint"]) if done else await _train(run, n, current, resume)
            # a finished stage too (stopped during its evaluation)
            await _evaluate(run, stage.name, n, current, held_out, also)
    _final_entropy(run, current)
    return write_report(out, recipe, run.state)


async def _train(run: RecipeRun, n: int, current: Path, resume: bool) -> Path:
    """Stage ``n``: its data, then its trainer from ``current``; its last checkpoint, recorded."""
    from ..rl.run.checkpoint import latest_checkpoint

    recipe, stage = run.recipe, run.recipe.stages[n - 1]
    stage_dir = run.out / f"{n:02d}-{stage.name}"
    run.log(f"[rstar2] stage {n}/{len(recipe.stages)}: {stage.name} ({stage.kind})")
    stage_dir.mkdir(parents=True, exist_ok=True)
    run.where = f"stage {stage.name} ({n}/{len(recipe.stages)}): its data"
    train = await stage_data(run, stage, current, stage_dir)
    tree = stage_tree(recipe, stage, model_path=str(current), train=str(train), out=str(stage_dir))
    tree["run"]["progress"] = run.progress
    if n > 1 and recipe.stages[n - 2].kind == stage.kind:
        # RL after RL continues the optimizer (unless the stage resets it); RL after SFT starts fresh
        tree["run"]["init_from"] = str(current)
    run.where = f"stage {stage.name} ({n}/{len(recipe.stages)})"
    stopped = await train_stage(parse_config(tree), resume, run.services)
    release_memory()
    ckpt = latest_checkpoint(stage_dir)
    if ckpt is None:
        raise RuntimeError(f"stage {stage.name} ended without a checkpoint in {stage_dir}")
    run.state["stages"][stage.name] = {
        "checkpoint": str(ckpt),
        "kind": stage.kind,
        "steps": int(ckpt.name.split("-")[-1]),  # the stage's steps, a resumed part included
        "stopped_early": stopped,
    }
    run.save_state()
    return ckpt


def _final_entropy(run: RecipeRun, model: Path) -> None:
    """``rstar2 analyze entropy`` of the final model on its own held-out trajectories, once per model."""
    recipe, last = run.recipe, run.recipe.stages[-1].name
    trajectories = sampled_trajectories(eval_dir(run.out, len(recipe.stages), last))
    limit = recipe.eval.entropy_trajectories
    if not limit or not trajectories.exists() or run.state.get("entropy") == str(model):
        return
    from ..analysis.entropy_report import analyze

    run.where = "entropy analysis of the final model"
    run.log(f"[rstar2] token entropy of the final model on its held-out trajectories ({last})")
    analyze(model, trajectories, run.out / "entropy", limit=limit, progress=run.progress)
    run.state["entropy"] = str(model)
    run.save_state()

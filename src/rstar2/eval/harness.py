"""`rstar2 eval`: sample K trajectories per problem through the training rollout code, score them,
and write trajectories (JSONL, appended as they finish, so a rerun resumes), a summary (JSON and
Markdown) and plots (PNG)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import DEFAULT_EVAL, DEFAULT_RUN, Columns, RolloutSection
from ..jsonl import write_jsonl
from ..problems import check_source, load_problems, source_name
from ..rollout.multi_turn import Rollout
from ..rollout.trajectory import Trajectory, read_trajectories
from . import NothingMeasured
from .metrics import summarize
from .report import plot_benchmark, summary_markdown


def plan(
    rows: list[dict], bench: str, samples: int, seed: int, done: set[tuple[int, int]]
) -> list[dict[str, Any]]:
    """The rollouts to sample: ``samples`` of each row but those ``done`` (problem index, sample)."""
    return [
        {
            "problem": row["problem"],
            "answer": str(row["answer"]),
            "gym": row.get("gym"),
            "seed": seed + pi * 1009 + s,
            "meta": {"bench": bench, "problem_index": pi, "sample": s, "problem_id": row.get("id", pi)},
        }
        for pi, row in enumerate(rows)
        for s in range(samples)
        if (pi, s) not in done
    ]


async def evaluate(
    rollout: Rollout,
    benches: Sequence[str],
    out_dir: str | Path,
    *,
    samples: int = DEFAULT_EVAL.samples,
    limit: int | None = None,
    seed: int = DEFAULT_RUN.seed,
    progress: bool = True,
    settings: dict[str, Any] | None = None,
    columns: Columns | None = None,
) -> dict[str, dict[str, Any]]:
    """``samples`` rollouts of each problem of ``benches`` into ``out_dir`` (reasoning-gym's drawn
    problems beside them, ``problems.jsonl``); returns each benchmark's summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    results: dict[str, list[Trajectory]] = {}  # this run's problems: earlier lines and new ones
    items: list[dict[str, Any]] = []
    for b in benches:
        name = source_name(b)
        rows = load_problems(b, columns)[:limit]
        files[name] = out / name / "trajectories.jsonl"
        if any("gym" in r for r in rows):
            write_jsonl(rows, out / name / "problems.jsonl")
        results[name], done = _resumed(files[name], rows, samples)
        items += plan(rows, name, samples, seed, done)
    await _sample_appending(rollout, items, files, results, progress)
    _refuse_if_nothing_generated(results, out)
    ks = sorted({2**i for i in range(samples.bit_length())} | {samples})  # powers of two, and samples
    summaries = {}
    for name, trajs in results.items():
        summaries[name] = summarize(trajs, ks=ks)
        plot_benchmark(name, trajs, out / name / "plots.png", ks=ks)
    report = {"settings": settings or {}, "benchmarks": summaries}
    (out / "summary.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    (out / "summary.md").write_text(summary_markdown(summaries, settings or {}), encoding="utf-8")
    return summaries


def _refuse_if_nothing_generated(results: dict[str, list[Trajectory]], out: Path) -> None:
    """A benchmark whose every rollout failed (the engine refused them all: a prompt longer than
    the model, a dead server) measured nothing: ``NothingMeasured`` with the commonest cause, not a
    row of zeros."""
    for name, trajs in results.items():
        if trajs and all(t.finish_reason == "error" for t in trajs):
            (cause, count), *_ = Counter(t.verdict for t in trajs).most_common(1)
            raise NothingMeasured(
                f"{name}: every one of the {len(trajs)} rollouts failed, so nothing was measured; "
                f"{count} of them: {cause} (trajectories in {out / name})"
            )


def _resumed(path: Path, rows: list[dict], samples: int) -> tuple[list[Trajectory], set[tuple[int, int]]]:
    """The trajectories ``path`` already holds of ``rows`` (their first ``samples`` samples), and
    their (problem index, sample) pairs; a line cut by a crash is dropped from the file."""
    path.parent.mkdir(exist_ok=True)
    old, bad = read_trajectories(path)
    if bad:  # rewrite without the half-written line, so new lines start on a line of their own
        write_jsonl((t.to_dict() for t in old), path)
    wanted = range(len(rows))
    kept = [t for t in old if t.meta.get("problem_index") in wanted and t.meta.get("sample", 0) < samples]
    return kept, {(t.meta["problem_index"], t.meta["sample"]) for t in kept}


async def _sample_appending(
    rollout: Rollout,
    items: list[dict[str, Any]],
    files: dict[str, Path],
    results: dict[str, list[Trajectory]],
    progress: bool,
) -> None:
    """Sample ``items``, each trajectory appended to its benchmark's file (flushed: an interrupted
    run keeps it) and to its ``results`` as it finishes."""
    from tqdm import tqdm

    handles = {name: path.open("a", encoding="utf-8") for name, path in files.items()}
    bar = tqdm(total=len(items), desc="eval", unit="traj", disable=not (progress and items))
    correct = 0

    def on_done(t: Trajectory) -> None:
        nonlocal correct
        fh = handles[t.meta["bench"]]
        fh.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")
        fh.flush()
        results[t.meta["bench"]].append(t)
        correct += t.correct
        bar.update(1)
        if not bar.disable:
            bar.set_postfix(acc=f"{correct / bar.n:.3f}")

    try:
        await rollout.run_many(items, on_done=on_done)
    finally:
        for fh in handles.values():
            fh.close()
        bar.close()


SHOWN = ("temperature", "top_p", "top_k", "max_response_tokens", "max_turns", "verify_mode")


def run_eval(
    settings: RolloutSection,
    benches: Sequence[str],
    out_dir: Path,
    *,
    model: str | None = None,
    tokenizer: str | None = None,
    device: str = "auto",
    samples: int = DEFAULT_EVAL.samples,
    limit: int | None = None,
    seed: int = DEFAULT_RUN.seed,
    columns: Columns | None = None,
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """``rstar2 eval``: the benchmarks (checked first) on a model or servers, reported in ``out_dir``."""
    from ..rollout.build import check_engine_choice, open_rollout

    for b in benches:
        check_source(b, columns)  # a bad name, file, row or task fails before anything starts
    check_engine_choice(model, settings, tokenizer)
    shown = {"model": model or ",".join(settings.engine.servers), "samples": samples}
    shown.update({k: getattr(settings, k) for k in SHOWN})
    if settings.banned_tokens:
        shown["banned_tokens"] = settings.banned_tokens

    async def go() -> dict[str, dict[str, Any]]:
        async with open_rollout(settings, model=model, tokenizer=tokenizer, device=device) as rollout:
            return await evaluate(
                rollout,
                benches,
                out_dir,
                samples=samples,
                limit=limit,
                seed=seed,
                settings=shown,
                columns=columns,
                progress=progress,
            )

    return asyncio.run(go())

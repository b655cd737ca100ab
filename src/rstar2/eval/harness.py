"""`rstar2 eval`: sample K trajectories per problem through the training rollout code, score them,
and write trajectories (JSONL, appended as they finish, so a rerun resumes), a summary (JSON and
Markdown) and plots (PNG)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import RolloutSection
from ..jsonl import write_jsonl
from ..problems import ALIASES, load_benchmark
from ..rollout.multi_turn import Rollout
from ..rollout.trajectory import Trajectory, read_trajectories
from .metrics import summarize
from .report import plot_benchmark, summary_markdown


def bench_name(name_or_path: str) -> str:
    name = ALIASES.get(name_or_path, name_or_path)
    return Path(name).stem if name.endswith(".jsonl") else name


def plan(
    rows: list[dict], bench: str, samples: int, seed: int, done: set[tuple[int, int]]
) -> list[dict[str, Any]]:
    items = []
    for pi, row in enumerate(rows):
        for s in range(samples):
            if (pi, s) in done:
                continue
            meta = {"bench": bench, "problem_index": pi, "sample": s, "problem_id": row.get("id", pi)}
            items.append(
                {
                    "problem": row["problem"],
                    "answer": str(row["answer"]),
                    "seed": seed + pi * 1009 + s,
                    "meta": meta,
                }
            )
    return items


async def evaluate(
    rollout: Rollout,
    benches: Sequence[str],
    out_dir: str | Path,
    *,
    samples: int = 16,
    limit: int | None = None,
    seed: int = 0,
    progress: bool = True,
    concurrency: int | None = None,
    settings: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    results: dict[str, list[Trajectory]] = {}  # this run's problems: earlier lines and new ones
    items: list[dict[str, Any]] = []
    for b in benches:
        name = bench_name(b)
        rows = load_benchmark(b)[:limit]
        (out / name).mkdir(exist_ok=True)
        files[name] = out / name / "trajectories.jsonl"
        old, bad = read_trajectories(files[name])
        if bad:  # rewrite without the half-written line, so new lines start on a line of their own
            _rewrite(files[name], old)
        wanted = range(len(rows))
        results[name] = [
            t for t in old if t.meta.get("problem_index") in wanted and t.meta.get("sample", 0) < samples
        ]
        done = {(t.meta["problem_index"], t.meta["sample"]) for t in results[name]}
        items += plan(rows, name, samples, seed, done)

    handles = {name: path.open("a", encoding="utf-8") for name, path in files.items()}
    bar = None
    if progress and items:
        from tqdm import tqdm

        bar = tqdm(total=len(items), desc="eval", unit="traj")
    correct = 0

    def on_done(t: Trajectory) -> None:
        nonlocal correct
        fh = handles[t.meta["bench"]]
        fh.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")
        fh.flush()
        results[t.meta["bench"]].append(t)
        correct += t.correct
        if bar is not None:
            bar.update(1)
            bar.set_postfix(acc=f"{correct / bar.n:.3f}")

    try:
        await rollout.run_many(items, concurrency=concurrency, on_done=on_done)
    finally:
        for fh in handles.values():
            fh.close()
        if bar is not None:
            bar.close()

    ks = _ks(samples)
    summaries = {}
    for name, trajs in results.items():
        summaries[name] = summarize(trajs, ks=ks)
        plot_benchmark(name, trajs, out / name / "plots.png", ks=ks)
    report = {"settings": settings or {}, "benchmarks": summaries}
    (out / "summary.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    (out / "summary.md").write_text(summary_markdown(summaries, settings or {}), encoding="utf-8")
    return summaries


SHOWN = ("temperature", "top_p", "top_k", "max_response_tokens", "max_turns", "verify_mode")


def run_eval(
    settings: RolloutSection,
    benches: Sequence[str],
    out_dir: Path,
    *,
    model: str | None = None,
    tokenizer: str | None = None,
    device: str = "auto",
    samples: int = 16,
    limit: int | None = None,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """``rstar2 eval``: the benchmarks (names or JSONL paths, checked first) on a local model or
    servers, summaries, tables and plots in ``out_dir``; rerunning resumes."""
    from ..rollout.build import check_engine_choice, open_rollout

    for b in benches:
        load_benchmark(b)  # a bad name or file fails before anything starts
    check_engine_choice(model, settings, tokenizer)
    shown = {"model": model or ",".join(settings.servers), "samples": samples}
    shown.update({k: getattr(settings, k) for k in SHOWN})
    if settings.banned_tokens:
        shown["banned_tokens"] = settings.banned_tokens

    async def go() -> dict[str, dict[str, Any]]:
        async with open_rollout(settings, model=model, tokenizer=tokenizer, device=device) as rollout:
            return await evaluate(
                rollout, benches, out_dir, samples=samples, limit=limit, seed=seed, settings=shown
            )

    return asyncio.run(go())


def _ks(samples: int) -> list[int]:
    ks, k = [], 1
    while k <= samples:
        ks.append(k)
        k *= 2
    if samples not in ks:
        ks.append(samples)
    return ks


def _rewrite(path: Path, trajs: list[Trajectory]) -> None:
    write_jsonl((t.to_dict() for t in trajs), path)

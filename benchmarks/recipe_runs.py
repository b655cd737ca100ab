"""Finished recipe runs side by side: where the minutes went and what each evaluation scored.

    python benchmarks/recipe_runs.py runs/ship-avx2 runs/trim-avx2 [runs/trim-bf16 ...]

Minutes come from the run folder's file times, as one timeline from the moment ``recipe.yaml`` was
written (the run's start, before the model's import): each evaluation (its ``summary.json``), each
stage's ladder and filter probes and its last checkpoint ends a phase. A resumed run rewrote
``recipe.yaml``, so its minutes are not a timing. Accuracies are read from each evaluation's
trajectories; the change against the first run is paired over the problems both evaluated (the same
seed gives the same problems), with its 95% interval. The baseline is the first run given.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rstar2.recipe.report_card import accuracy_in, paired_change, percent


def timeline(run: Path) -> list[tuple[str, float]]:
    """(phase, minutes) in the order they ended."""
    marks = [(p.stat().st_mtime, p.parent.name) for p in run.glob("eval/*/summary.json")]
    for stage in sorted(run.glob("[0-9][0-9]-*")):
        marks += [(p.stat().st_mtime, f"{stage.name} {p.parent.name}") for p in stage.glob("*/summary.json")]
        checkpoints = sorted(stage.glob("checkpoints/step-*"))
        if checkpoints:
            marks.append((checkpoints[-1].stat().st_mtime, f"{stage.name} training"))
    start = (run / "recipe.yaml").stat().st_mtime
    out = []
    for t, name in sorted(marks):
        out.append((name, (t - start) / 60))
        start = t
    return out


def accuracies(run: Path) -> dict[str, dict]:
    """Each evaluation folder's per-problem accuracy."""
    return {p.parent.name: accuracy_in(p.parent) for p in sorted(run.glob("eval/*/summary.json"))}


def row(*cells: str) -> None:
    print("| " + " | ".join(cells) + " |")


def mean(accuracy: dict) -> float:
    return sum(accuracy.values()) / len(accuracy)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "runs", nargs="+", type=Path, help="finished recipe run folders; the first is the baseline"
    )
    runs = ap.parse_args(argv).runs
    names = [str(r) for r in runs]
    row("phase", *names)
    row("---", *["---:"] * len(runs))
    lines = [dict(timeline(r)) for r in runs]
    for name in dict.fromkeys(name for line in lines for name in line):  # each run's phases, in order
        row(name, *(f"{line[name]:.1f} min" if name in line else "–" for line in lines))
    row("**whole**", *(f"**{sum(line.values()):.1f} min**" for line in lines))
    print()
    base, *others = [accuracies(r) for r in runs]
    row("evaluation", *names)
    row("---", *["---:"] * len(runs))
    for name, ref in base.items():
        cells = [percent(mean(ref))]
        for other in others:
            if name in other:
                change, half, n = paired_change(ref, other[name])
                cells.append(f"{percent(mean(other[name]))} ({100 * change:+.1f} ± {100 * half:.1f}, {n})")
            else:
                cells.append("–")
        row(name, *cells)


if __name__ == "__main__":
    main()

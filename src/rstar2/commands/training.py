"""``rstar2 train``, ``demo``, ``compare`` and ``replay``: runs, started, compared and redone."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from .shared import PROGRESS, console, failures, log


def train(
    config: Path | None = typer.Argument(
        None, exists=True, dir_okay=False, help="YAML config of one run (kind: rl or sft)."
    ),
    recipe: str | None = typer.Option(
        None, "--recipe", help="A recipe (stages SFT -> RL ...): a YAML path, or a name in recipes/ (tiny)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from the run's last checkpoint."),
    out: str | None = typer.Option(None, "--out", help="Run folder (overrides run.out; recipes: runs/NAME)."),
    set_: list[str] = typer.Option(
        [], "--set", help="Override one value: --set optim.lr=1e-5, or stages.rl-64.run.steps=5 (repeatable)."
    ),
    progress: bool = PROGRESS,
) -> None:
    """Train: GRPO-RoC (kind: rl) or supervised fine-tuning (kind: sft), or a whole recipe with
    --recipe. Under torchrun, every process runs this command:
    `torchrun --nproc-per-node N -m rstar2 train CONFIG`."""
    from ..config_files import load_config
    from ..recipe.run import run_named
    from ..rl.train import train_config

    if (config is None) == (recipe is None):
        console.print("[red]error:[/red] give a CONFIG file or --recipe (not both)")
        raise typer.Exit(2)
    with failures():
        if recipe is not None:
            console.print(run_named(recipe, out, resume, set_, progress, log=log), markup=False)
            return
        cfg = load_config(config, list(set_) + ([f"run.out={out}"] if out else []))
    with failures(f"traceback: {Path(cfg.run.out) / 'error.txt'}"):
        done = train_config(cfg, resume)
    if done:
        console.print(done, markup=False)


def demo(
    recipe: str = typer.Option("tiny", "--recipe", help="A shipped recipe's name, or a YAML path."),
    out: str | None = typer.Option(None, "--out", help="Run folder (default: runs/RECIPE)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted demo."),
    set_: list[str] = typer.Option(
        [], "--set", help="Override one value: stages.sft.run.steps=50 (repeatable)."
    ),
    progress: bool = PROGRESS,
) -> None:
    """The main job on the embedded default: the tiny recipe (SFT -> RL stages) on a CPU."""
    from ..recipe.run import run_named

    with failures():
        console.print(run_named(recipe, out, resume, set_, progress, log=log), markup=False)


def compare_cmd(
    source: Path = typer.Argument(
        ...,
        exists=True,
        file_okay=False,
        help="A finished recipe run folder (its SFT checkpoint is the start).",
    ),
    out: Path | None = typer.Option(
        None, "--out", file_okay=False, help="Comparison folder (default: SOURCE-compare)."
    ),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Seeds per variant (run.seed 0..N-1)."),
    variants: str = typer.Option(
        "roc,grpo-kept,grpo-all",
        "--variants",
        help="Comma-separated: roc, grpo-kept, grpo-all (and roc-uniform; asynchronous: async-k1, "
        "async-k2, async-k4, async-k4-none).",
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override one value of every arm's recipe: stages.rl-192.run.steps=8 (repeatable)."
    ),
    stages: str | None = typer.Option(
        None, "--stages", help="Comma-separated RL stages of the recipe to run (default: all of them)."
    ),
    lever: list[str] = typer.Option(
        [],
        "--lever",
        help="A variant of your own: NAME:KEY=VALUE[;KEY=VALUE...], the recipe's RL with these settings "
        "(e.g. 'kl:defaults.rl.loss.kl_coef=0.05'); repeatable, run after --variants.",
    ),
    parallel: int = typer.Option(
        1,
        "--parallel",
        min=1,
        help="Runs at once, each in a process of its own (a GPU a small model leaves idle).",
    ),
    progress: bool = PROGRESS,
) -> None:
    """GRPO-RoC against plain GRPO (on as many rollouts as RoC keeps, and on all 2G), or the
    synchronous loop against asynchronous ones, each over seeds, from a recipe run's SFT checkpoint:
    per-step curves, final accuracy with paired intervals, time and memory (compare.md). Resumes an
    interrupted comparison."""
    from ..recipe.compare import parse_lever, run_comparison

    with failures():
        report = run_comparison(
            source,
            out or source.with_name(source.name + "-compare"),
            seeds=range(seeds),
            variants=[v.strip() for v in variants.split(",") if v.strip()],
            overrides=set_,
            stages=None if stages is None else [s.strip() for s in stages.split(",") if s.strip()],
            levers=dict(parse_lever(x) for x in lever),
            parallel=parallel,
            progress=progress,
            log=log,
        )
    console.print(report.read_text(), markup=False)
    console.print(f"report: {report}")


def replay_cmd(
    run: Path = typer.Argument(
        ...,
        exists=True,
        file_okay=False,
        help="An RL run folder that kept its steps (run.keep_steps: true), e.g. a recipe's runs/NAME/02-rl-64.",
    ),
    step: int | None = typer.Option(
        None, "--step", min=1, help="Redo this step and compare it with the run."
    ),
    first: int | None = typer.Option(None, "--from", min=1, help="Redo steps from this one ..."),
    last: int | None = typer.Option(
        None, "--to", min=1, help="... to this one; name the first that differs."
    ),
    set_: list[str] = typer.Option(
        [],
        "--set",
        help="What-if on --step: a loss., roc. or optim. setting changed, e.g. loss.clip_high=0.2 (repeatable).",
    ),
    rtol: float = typer.Option(
        0.0,
        "--rtol",
        min=0.0,
        help="Count a tensor or metric within this relative tolerance of the run's as the same (0: bit for bit, "
        "as CPU and same-GPU replays are; for a replay on another GPU model or CUDA library).",
    ),
) -> None:
    """Redo kept RL steps from the checkpoint before them and compare every weight, optimizer
    tensor and metric with the run's (bit for bit, or how far apart); with --set, the step also
    with a setting changed. The report goes to RUN/replay/ (and into `rstar2 view RUN`). Exits 1
    when a redone step differs from the run."""
    from ..rl.replay import replay, summary, write_report

    if (step is None) == (first is None and last is None) or (step is None and None in (first, last)):
        console.print("[red]error:[/red] give --step N, or --from A --to B")
        raise typer.Exit(2)
    if set_ and step is None:
        console.print("[red]error:[/red] a what-if (--set) changes one step: give --step N")
        raise typer.Exit(2)
    a, b = (step, step) if step is not None else (first, last)
    name = f"step_{a}" if a == b else f"from_{a}_to_{b}"
    if set_:
        name += "_" + "_".join(re.sub(r"[^A-Za-z0-9._=-]", "-", o) for o in set_)

    def said(result) -> None:
        how = "the run's" if result.matches else f"DIFFERS ({len(result.differing)} tensors)"
        console.print(f"step {result.step}: {how} ({result.seconds:.1f} s)", markup=False)

    with failures():
        report = replay(run, a, b, list(set_), progress=said, rtol=rtol)
    path = write_report(run, report, name)
    typer.echo(summary(report))  # markdown tables: not wrapped to the terminal
    typer.echo(f"report: {path} (and in `rstar2 view {run}`)")
    if report.first_difference is not None:
        raise typer.Exit(1)

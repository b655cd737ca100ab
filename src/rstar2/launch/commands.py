"""``rstar2 launch`` and the command each node runs, ``rstar2 launch-node``."""

from __future__ import annotations

import os
import shutil
import signal
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True, soft_wrap=True)  # paths and errors whole, never cut at a width


class Road(str, Enum):
    local = "local"
    slurm = "slurm"
    ray = "ray"


def _fail(text: str, code: int = 2) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(text)}", highlight=False)
    return typer.Exit(code)


def launch(
    config: Path | None = typer.Argument(
        None,
        exists=True,
        dir_okay=False,
        help="A training config (kind: rl or sft) or a recipe, with its cluster: section.",
    ),
    on: Road = typer.Option(
        ..., "--on", help="Where the nodes run: this machine, a SLURM job, or a Ray cluster."
    ),
    recipe: str | None = typer.Option(
        None, "--recipe", help="A recipe by name (recipes/NAME.yaml) or path, instead of CONFIG."
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override one value: --set cluster.nodes=4 (repeatable)."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Write the plan (SLURM: the sbatch script) and stop."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in cluster.run_dir from its last checkpoint."
    ),
    address: str | None = typer.Option(
        None, "--address", help="Ray: the cluster's address (default: $RAY_ADDRESS)."
    ),
) -> None:
    """Run a config or a recipe across the nodes of its cluster: section, wired and checked before
    the first step (docs/cluster.md)."""
    from ..recipe.spec import find_recipe
    from . import roads
    from .plan import new_plan

    if (config is None) == (recipe is None):
        raise _fail("give a CONFIG file or --recipe (not both)")
    where = address or os.environ.get("RAY_ADDRESS")
    if on is Road.ray and not where and not dry_run:
        raise _fail("--on ray needs the cluster's address: --address HOST:PORT (or $RAY_ADDRESS)")
    try:
        source = config if config is not None else find_recipe(recipe)  # type: ignore[arg-type]
        if not Path(source).is_file():
            raise FileNotFoundError(f"{source}: no such file")
        plan = new_plan(Path(source), list(set_))
    except (ValueError, OSError) as exc:
        raise _fail(str(exc)) from None
    run_dir = Path(plan.run_dir)
    if run_dir.exists() and any(p.name != "launch" for p in run_dir.iterdir()) and not resume:
        raise _fail(f"{run_dir} holds a run: pass --resume to continue it, or choose another cluster.run_dir")
    attempt = 1 + len(list((run_dir / "launch").glob("attempt-*")))
    if on is Road.slurm:
        script = run_dir / "launch" / "launch.sbatch"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(roads.sbatch_script(plan, attempt))
        if dry_run:
            console.print(f"sbatch script: {script}", markup=False)
            return
        if not shutil.which("sbatch"):
            raise _fail("sbatch is not on PATH: run this where SLURM's commands are (a login node)")
    elif dry_run:
        console.print(plan.to_json(), markup=False)
        return
    logs = run_dir / "launch" / f"attempt-{attempt}"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "plan.json").write_text(plan.to_json())  # what this attempt ran (the secrets are in no file)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # ends the launch as Ctrl-C does
    try:
        if on is Road.local:
            roads.run_local(plan, attempt, say=_say)
        elif on is Road.slurm:
            roads.run_slurm(plan, script, attempt, say=_say)
        else:
            roads.run_ray(plan, attempt, where, say=_say)  # type: ignore[arg-type]
    except roads.LaunchError as exc:
        raise _fail(str(exc), 1) from None
    except ImportError as exc:
        raise _fail(f"{exc}: pip install 'rstar2[ray]'") from None
    except KeyboardInterrupt:
        raise _fail("stopped: every node was stopped", 130) from None
    console.print(f"run {plan.run_id} finished: {run_dir}", markup=False)


def launch_node(
    rank: int = typer.Option(..., "--rank", min=0, help="This node's rank (0: the head)."),
    hosts: str = typer.Option(..., "--hosts", help="Every node's address, in rank order, comma-separated."),
    attempt: int = typer.Option(1, "--attempt", min=1, help="The launch's attempt (its log folder)."),
    plan_file: Path | None = typer.Option(
        None, "--plan", exists=True, dir_okay=False, help="The plan's file (default: $RSTAR2_LAUNCH_PLAN)."
    ),
) -> None:
    """One node of `rstar2 launch` (started by the launch on each node; not for hand use)."""
    from .node import run_node
    from .plan import PLAN_ENV, Plan

    text = plan_file.read_text() if plan_file else os.environ.get(PLAN_ENV)
    if not text:
        raise _fail(f"no plan: give --plan FILE or ${PLAN_ENV}")
    plan = Plan.from_json(text)
    names = hosts.split(",")
    if rank >= len(names):
        raise _fail(f"--rank {rank}: only {len(names)} nodes in --hosts")
    if Path(plan.cwd).is_dir():
        os.chdir(plan.cwd)
    raise typer.Exit(run_node(plan, rank, names, attempt))


def _say(text: str) -> None:
    console.print(text, markup=False)

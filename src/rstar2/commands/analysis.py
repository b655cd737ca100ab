"""``rstar2 analyze entropy`` and ``rstar2 view``: looking inside runs and their trajectories."""

from __future__ import annotations

from pathlib import Path

import typer

from ..bounds import above, setting
from ..config import DEFAULT_ROLLOUT, DEFAULT_RUN, RunSection
from .shared import MODEL_HELP, console

app = typer.Typer(help="Look inside runs: token entropy of trajectories.", no_args_is_help=True)


@app.command("entropy")
def analyze_entropy(
    model: Path = typer.Option(..., "--model", exists=True, file_okay=False, help=MODEL_HELP),
    trajectories: Path = typer.Option(
        ...,
        "--trajectories",
        exists=True,
        dir_okay=False,
        help="A trajectories JSONL (rstar2 eval, RL samples).",
    ),
    top: float = typer.Option(
        0.2, **above(0, 1), help="Share of each trajectory's model tokens marked high-entropy."
    ),
    window: int = typer.Option(
        DEFAULT_RUN.reflection_window,
        **setting(RunSection, "reflection_window"),
        help="Model tokens after a tool response counted as reflection.",
    ),
    limit: int | None = typer.Option(None, min=1, help="Only the first N trajectories."),
    temperature: float = typer.Option(
        DEFAULT_ROLLOUT.temperature, **above(0), help="The sampling temperature the entropy is taken at."
    ),
    device: str = typer.Option("auto", help="cpu, cuda, ... (auto: CUDA when present)."),
    out: Path = typer.Option(Path("runs/entropy"), "--out", "-o", file_okay=False, help="Output folder."),
) -> None:
    """Entropy of every model token (teacher-forced): high-entropy shares of reasoning, reflection,
    code and answer tokens, the most frequent high-entropy tokens, entropy over the response;
    Markdown, JSON, PNG and an HTML page of tokens coloured by entropy."""
    from ..analysis.entropy_report import analyze

    options = {"top": top, "window": window, "limit": limit, "temperature": temperature, "device": device}
    try:
        summary = analyze(model, trajectories, out, **options)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    for line in summary.lines():
        console.print(line)
    console.print(f"report: {out / 'entropy.md'}  tokens: {out / 'tokens.html'}")


def view_cmd(
    target: Path = typer.Argument(..., exists=True, help="A run folder or a trajectories JSONL file."),
    out: Path | None = typer.Option(
        None, "--out", "-o", dir_okay=False, help="HTML file (default: view.html beside it)."
    ),
    limit: int = typer.Option(2000, min=1, help="At most this many trajectories."),
    health: str | None = typer.Option(
        None,
        "--health",
        help="Only trajectories showing this tool-use health sign: no_call, unparseable, repeated, output_cut.",
    ),
) -> None:
    """A static HTML viewer of trajectories (offline): tool calls, outputs, statuses, rewards, RoC,
    tool-use health signs."""
    from ..analysis.view import view

    try:
        path = view(target, out, limit, health)
    except (FileNotFoundError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from None
    console.print(f"viewer: {path}")

"""``rstar2 verify``: answers graded against references, one pair or a JSON Lines file (the
grading itself is ``reward/pairs.py``'s)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from ..bounds import above
from ..config import DEFAULT_ROLLOUT
from .shared import console


def verify(
    reference: str | None = typer.Option(
        None, "--reference", "-r", help="Reference answer (LaTeX or a number)."
    ),
    response: str | None = typer.Option(
        None, "--response", help="File with the model's response, or - for stdin."
    ),
    jsonl: Path | None = typer.Option(
        None,
        exists=True,
        dir_okay=False,
        help="JSON Lines with fields 'reference' and 'response' (optional 'label': true/false).",
    ),
    mode: str = typer.Option(
        DEFAULT_ROLLOUT.verify_mode, help="strict: \\boxed{} inside <answer>; lenient: any final answer."
    ),
    extracted: bool = typer.Option(False, "--extracted", help="The responses are already the final answers."),
    timeout_s: float = typer.Option(2.0, "--timeout", **above(0), help="Time box per check in seconds."),
    workers: int = typer.Option(0, min=0, help="Checking processes (0: up to 4)."),
    output: Path | None = typer.Option(
        None, "--output", "-o", dir_okay=False, help="Write verdicts here instead of stdout."
    ),
) -> None:
    """Grade answers: one pair (exit status 0 = correct, 1 = not), or a JSON Lines file."""
    from ..reward.pairs import grade_file, grade_one

    if mode not in ("strict", "lenient"):
        raise typer.BadParameter("--mode must be strict or lenient")
    if (jsonl is None) == (reference is None or response is None):
        raise typer.BadParameter("give either --reference and --response, or --jsonl")
    pool = {"workers": workers or None, "timeout_s": timeout_s, "mode": mode}
    if jsonl is None:
        text = sys.stdin.read() if response == "-" else Path(str(response)).read_text(errors="replace")
        verdict = grade_one(str(reference), text, extracted, **pool)
        print(json.dumps(verdict.to_dict()))
        raise typer.Exit(0 if verdict.correct else 1)
    try:
        table = grade_file(jsonl, output or sys.stdout, extracted, console, **pool)
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from None
    console.print(table)

"""What several of the ``rstar2`` command's modules share: the options and help texts more than one
module takes (each spelled once, so a help text or a bound cannot drift between commands), the console
the commands speak on, and how a failed command exits (``failures``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True)

MODEL_HELP = "A local Hugging Face model directory, run in this process (transformers)."


def _bars(progress: bool) -> bool:
    """--no-progress silences the libraries' bars too (transformers' GGUF conversion and shard
    writing, in this process and its children): tqdm reads TQDM_DISABLE when it is first imported,
    which the CLI has not done yet when it parses its options."""
    if not progress:
        os.environ["TQDM_DISABLE"] = "1"
    return progress


PROGRESS = typer.Option(True, "--progress/--no-progress", help="Progress bars.", callback=_bars)


def log(text: str) -> None:
    console.print(text, markup=False)


@contextmanager
def failures(after_run_error: str | None = None) -> Iterator[None]:
    """A run that started and failed (``RunError``: the first error and where; the run folder keeps
    the rest; a server that refused or failed ``eval``/``chat``) exits 1; bad data, paths or settings
    exit 2: both say what, without a traceback."""
    from ..engines.openai import ServerError
    from ..eval import NothingMeasured
    from ..rl.run.launch import RunError

    try:
        yield
    except (RunError, NothingMeasured, ServerError, ValueError, OSError, ImportError) as exc:
        ran = isinstance(exc, (RunError, NothingMeasured, ServerError))  # a 4xx ServerError: a ValueError too
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        if ran and after_run_error:
            console.print(after_run_error, markup=False)
        raise typer.Exit(1 if ran else 2) from None

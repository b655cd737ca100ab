"""What several of the ``rstar2`` command's modules share: the options more than one command takes
(each spelled once, so a help text or a bound cannot drift between commands), the console the
commands speak on, and how a failed command exits (``failures``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape

from ..bounds import setting
from ..config import DEFAULT_ROLLOUT, EVAL_ROLLOUT, RolloutSection
from ..sandbox import commands as sandbox_commands

console = Console(stderr=True)

MODEL_HELP = "A local Hugging Face model directory, run in this process (transformers)."
# options `eval` and `chat` share (their defaults: config.EVAL_ROLLOUT, config.CHAT_ROLLOUT)
MODEL = typer.Option(None, "--model", help=MODEL_HELP)
SERVERS = typer.Option(
    None, "--servers", "--server", help="An OpenAI-compatible server (vLLM, SGLang, rstar2 serve); repeat."
)
TOKENIZER = typer.Option(
    None, help="Tokenizer directory (default: the model directory; needed with --servers)."
)
SANDBOX = typer.Option(
    None, help="URL of `rstar2 sandbox serve` (default: a local sandbox pool in this process)."
)
TOP_P = typer.Option(
    None, **setting(RolloutSection, "top_p"), help=f"Nucleus sampling (default {DEFAULT_ROLLOUT.top_p})."
)
MAX_TURNS = typer.Option(
    None,
    **setting(RolloutSection, "max_turns"),
    help=f"Most assistant turns (default {EVAL_ROLLOUT['max_turns']}).",
)
STATEFUL = typer.Option(None, "--stateful", help="Also offer python_session.")
SYSTEM_PROMPT = typer.Option(None, help="System prompt ('' for none; default rstar2's).")
NO_TOOLS = typer.Option(
    False,
    "--no-tools",
    help="A model without tool use: the bare problem, no tool schemas, one turn, lenient.",
)
CONFIG = typer.Option(
    None,
    "--config",
    exists=True,
    dir_okay=False,
    help="Take the rollout settings from a file: an RL config (its rollout: section) or a recipe (those "
    "its evaluations sample with: its last RL stage's under its eval: draw and budget). Options given here "
    "win over it.",
)
SET = typer.Option([], "--set", help="Override one rollout setting: --set top_k=20 (repeatable).")
DEVICE = typer.Option("auto", help="With --model: cpu, cuda, ... (auto: CUDA when present).")


def _bars(progress: bool) -> bool:
    """--no-progress silences the libraries' bars too (transformers' GGUF conversion and shard
    writing, in this process and its children): tqdm reads TQDM_DISABLE when it is first imported,
    which the CLI has not done yet when it parses its options."""
    if not progress:
        os.environ["TQDM_DISABLE"] = "1"
    return progress


PROGRESS = typer.Option(True, "--progress/--no-progress", help="Progress bars.", callback=_bars)

# the servers' options (`serve`, `vllm`): the key and port are the sandbox service's own
API_KEY, PORT = sandbox_commands.API_KEY, sandbox_commands.PORT
ANY_PORT, PORT_HELP = sandbox_commands.ANY_PORT, sandbox_commands.PORT_HELP
WEIGHTS_FROM = typer.Option(
    [],
    "--weights-from",
    exists=True,
    file_okay=False,
    help="A folder weight loads may come from (the trainer's run folders); repeat. None: no loads.",
)
FETCH_FROM = typer.Option(
    None,
    "--fetch-from",
    help="The trainer's weight service (URL) whose folders /mirror_weights copies here before a load "
    "(rstar2 launch, cluster.shared_fs: false). None: it fetches none.",
)


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
    except (RunError, NothingMeasured, ServerError) as exc:  # ServerError before ValueError: a 4xx is both
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        if after_run_error:
            console.print(after_run_error, markup=False)
        raise typer.Exit(1) from None
    except (ValueError, OSError, ImportError) as exc:  # ConfigError is a ValueError; a missing extra
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None

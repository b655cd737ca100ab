"""``rstar2 serve`` and ``rstar2 vllm``: the OpenAI-compatible servers an engine reaches, each with
the key it requires and the folders it may load weights from."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import typer
from rich.markup import escape

from .. import auth
from ..bounds import setting
from ..config import DEFAULT_ROLLOUT, EngineSection, LoraSection
from ..engines import vllm_launch as launch
from ..engines.budget import CAPACITY_HELP, KEEP_HELP
from ..sandbox.commands import ANY_PORT, API_KEY, PORT, PORT_HELP
from .shared import MODEL_HELP, console, failures

# the options both servers take (the key and port: the sandbox service's; typer checks each folder)
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


def access(
    api_key: str | None, host: str, what: str, weights_from: list[Path], fetch_from: str | None
) -> dict:
    """Who may call service ``what`` and where its weights may come from; the key's warning
    (``auth.service_key``) said."""
    key, warning = auth.service_key(api_key, host, what)
    if warning:
        console.print(f"[yellow]\\[rstar2] {warning}[/yellow]")
    return {"api_key": key, "weights_from": [f.resolve() for f in weights_from], "fetch_from": fetch_from}


def serve(
    model: Path = typer.Option(..., "--model", exists=True, file_okay=False, help=MODEL_HELP),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(8000, **ANY_PORT, help=PORT_HELP),
    device: str = typer.Option("auto", help="cpu, cuda, cuda:1, ... (auto: CUDA when present)."),
    dtype: str = typer.Option(
        "auto", help="Weights: auto (bf16 on a GPU that computes it, else fp32), float32, bfloat16."
    ),
    max_batch_size: int = typer.Option(
        DEFAULT_ROLLOUT.engine.max_batch_size,
        **setting(EngineSection, "max_batch_size"),
        help="Requests generated together in one batch.",
    ),
    name: str | None = typer.Option(None, help="Model name clients use (default: the directory name)."),
    capacity_tokens: int | None = typer.Option(
        None,
        **setting(EngineSection, "capacity_tokens"),
        help=f"KV tokens this server holds (default: {CAPACITY_HELP}).",
    ),
    keep_tokens: int | None = typer.Option(
        None,
        **setting(EngineSection, "keep_tokens"),
        help=f"Of those, KV tokens kept for a conversation's next turn (default: {KEEP_HELP}; 0: none); "
        "the rest is what the server reports to the kv scheduler.",
    ),
    kind: str = typer.Option(
        DEFAULT_ROLLOUT.engine.kind,
        help="The in-process engine that decodes it: hf, or a kind an installed package declares "
        "(the rstar2.engines entry points).",
    ),
    api_key: str | None = API_KEY,
    weights_from: list[Path] = WEIGHTS_FROM,
    fetch_from: str | None = FETCH_FROM,
) -> None:
    """Serve a model over an OpenAI-compatible API (/v1/completions, /v1/chat/completions), and load
    a trainer's new weights in place (/update_weights_from_disk) from the --weights-from folders."""
    from ..engines.server import serve as serve_model

    sizes = {"max_batch_size": max_batch_size, "capacity_tokens": capacity_tokens, "keep_tokens": keep_tokens}
    allowed = access(api_key, host, "rstar2 serve", weights_from, fetch_from)
    with failures():  # a size the model cannot take (keep_tokens leaving no room): exit 2
        serve_model(
            model,
            host,
            port,
            name=name,
            device=device,
            dtype=dtype,
            kind=kind,
            log=console.print,
            **allowed,
            **sizes,
        )


def vllm_cmd(
    ctx: typer.Context,
    model: Path = typer.Option(
        ...,
        "--model",
        exists=True,
        file_okay=False,
        help="A local Hugging Face model directory (served by vLLM).",
    ),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(8000, **PORT, help="Port."),
    dtype: str = typer.Option("auto", help="Weights: auto, float32, bfloat16, float16."),
    max_model_len: int | None = typer.Option(
        None, min=1, help="Longest prompt + response (default: the model's)."
    ),
    eager: bool = typer.Option(False, help="Skip torch.compile: a faster start (see RESULTS.md for decode)."),
    cores: str | None = typer.Option(
        None, help="CPU: the cores its engine is bound to, e.g. 0-1 or 1 (default: every core)."
    ),
    kv_cache_gib: int | None = typer.Option(None, min=1, help="CPU: GiB of KV cache (default: vLLM's)."),
    lora_rank: int | None = typer.Option(
        None,
        **setting(LoraSection, "rank"),
        help="Serve adapters (model.lora) up to this rank, loaded at each update (default: none).",
    ),
    lora_slots: int = typer.Option(
        launch.LORA_SLOTS, min=1, help="With --lora-rank: adapters held at once, the newest."
    ),
    python: str | None = typer.Option(
        None, help="The Python of vLLM's environment (default: $RSTAR2_VLLM_PYTHON, else .venv-vllm)."
    ),
    api_key: str | None = API_KEY,
    weights_from: list[Path] = WEIGHTS_FROM,
    fetch_from: str | None = FETCH_FROM,
    open_route: list[str] | None = typer.Option(
        None,
        help="Open one of vLLM's routes outside rstar2's road, closed by default because they may "
        "change or free the weights outside rstar2's versioned loads (/sleep, /wake_up, "
        "/weight_checker, /update_weights, ...); repeatable.",
    ),
) -> None:
    """Start a vLLM server ready for rstar2: in-place weight loads, each token's weight version, the
    sampled distribution's log-probs, priority scheduling. Arguments after -- go to vLLM."""
    exe = launch.vllm_python(python)
    if not shutil.which(exe):
        raise typer.BadParameter(f"--python {exe}: not found (scripts/setup-vllm.sh installs vLLM)")
    args = launch.command(
        str(model),
        python=exe,
        host=host,
        port=port,
        dtype=dtype,
        max_model_len=max_model_len,
        eager=eager,
        lora_rank=lora_rank,
        lora_slots=lora_slots,
        extra=tuple(ctx.args),
    )
    bad = [r for r in open_route or () if not r.startswith("/") or "," in r]
    if bad:
        raise typer.BadParameter(f"--open-route {bad[0]}: give a route as vLLM names it, e.g. /sleep")
    allowed = access(api_key, host, "rstar2 vllm", weights_from, fetch_from)
    try:  # vLLM binds it before loading too, but says a port taken only as a traceback, after its imports
        launch.port_free(host, port)
    except OSError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    console.print(f"\\[rstar2] {' '.join(args)}")
    env = launch.environment(cores, kv_cache_gib, open_routes=open_route, **allowed)
    os.execve(exe, args, env)  # signals reach vLLM itself

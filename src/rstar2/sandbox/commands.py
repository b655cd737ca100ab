"""``rstar2 sandbox run | info | serve | worker``: the code environment's commands, and
what each does (the ``rstar2`` command adds them as its ``sandbox`` group)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..bounds import above
from .defaults import DEADLINE_S, LEASE_S
from .defaults import PORT as DEFAULT_PORT
from .request import DEFAULT_LIMITS, MAX_MEMORY_MB, MAX_TIMEOUT_S, MIN_MEMORY_MB, ExecRequest, Limits
from .result import ExecResult
from .zygote import PRELOAD

app = typer.Typer(help="The code environment: isolated, fast Python execution.", no_args_is_help=True)
console = Console(stderr=True)
# every service that runs code or loads weights takes it (rstar2 serve and rstar2 vllm too)
API_KEY = typer.Option(
    None,
    "--api-key",
    help="Callers must send it as 'Authorization: Bearer KEY' (default: $RSTAR2_API_KEY; none: open).",
    show_default=False,
)
# a call's limits, within what the service accepts of a call (``service.RunBody``)
TIMEOUT = above(0, MAX_TIMEOUT_S)
MEMORY = {"min": MIN_MEMORY_MB, "max": MAX_MEMORY_MB}
# serve's and worker's: the default limits a call gets there
TIMEOUT_OPTION = typer.Option(
    DEFAULT_LIMITS.timeout_s, "--timeout", **TIMEOUT, help="Default wall-clock limit per call."
)
MEMORY_OPTION = typer.Option(
    DEFAULT_LIMITS.memory_mb, "--memory-mb", **MEMORY, help="Default memory limit per call."
)
# worker k runs calls as uid UID_BASE + k (isolation.py): these stay below 65534 (nobody)
WORKERS = {"min": 0, "max": 4096}
PORT = {"min": 1, "max": 65535}
ANY_PORT = {"min": 0, "max": 65535}  # a service that says the port it bound: 0 takes any free one
PORT_HELP = "Port (0: any free one; the one bound is said on start)."


def parse_preload(text: str | None) -> list[str] | None:
    """Comma-separated module names; ``default`` stands for the default list."""
    if not text:
        return None
    names: list[str] = []
    for name in (m.strip() for m in text.split(",")):
        names.extend(PRELOAD if name == "default" else [name] if name else [])
    return names


# -- the commands ----------------------------------------------------------------------------
PRELOAD_HELP = (
    "Modules each worker imports once, comma-separated (default: math, fractions, itertools, "
    "collections, ..., numpy, sympy; 'default' stands for that list). Fewer modules make a smaller "
    "worker and a cheaper fork; add rstar2.reward.equivalence to check answers on the workers."
)


@app.command("run")
def sandbox_run(
    file: str = typer.Argument(..., help="Python file to run, or - for standard input."),
    input: str = typer.Option("", "--input", "-i", help="Text given to the code on its standard input."),
    input_file: Path | None = typer.Option(
        None, exists=True, dir_okay=False, help="File whose content is the code's standard input."
    ),
    timeout_s: float = typer.Option(
        DEFAULT_LIMITS.timeout_s, "--timeout", **TIMEOUT, help="Wall-clock limit in seconds."
    ),
    memory_mb: int = typer.Option(
        DEFAULT_LIMITS.memory_mb, "--memory-mb", **MEMORY, help="Memory limit in MiB."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the whole result as JSON."),
    url: str | None = typer.Option(None, help="Run on a sandbox service at this URL instead of locally."),
) -> None:
    """Run one piece of code in the sandbox and show what came back."""
    from .client import Client
    from .local_pool import LocalPool

    code = sys.stdin.read() if file == "-" else Path(file).read_text()
    stdin = input_file.read_text() if input_file else input
    req = ExecRequest(code=code, input=stdin, timeout_s=timeout_s, memory_mb=memory_mb)

    async def go() -> ExecResult:  # on the service at `url`, else in a one-worker local pool
        if url:
            async with Client(url) as client:
                return await client.run(req)
        async with LocalPool(workers=1) as pool:
            return await pool.run(req)

    result = asyncio.run(go())
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        sys.stdout.write(result.stdout)
        if result.value is not None:
            print(result.value)
        sys.stderr.write(result.stderr)
        extra = f" ({result.reason})" if result.reason else ""
        console.print(
            f"[bold]status[/bold]: {result.status}{extra}  [dim]{result.duration_s * 1000:.1f} ms[/dim]"
        )
    raise typer.Exit(0 if result.ok else 1)


@app.command("info")
def sandbox_info(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show which isolation layers are active on this machine, and why others are not."""
    from .isolation import IsolationConfig
    from .worker_handle import WorkerHandle

    async def go() -> dict[str, Any]:  # what a started worker says of the layers active here
        handle = WorkerHandle(0, Limits(), IsolationConfig())
        await handle.start()
        try:
            return dict(handle.hello)
        finally:
            await handle.close()

    hello = asyncio.run(go())
    if as_json:
        print(json.dumps(hello, indent=2))
        return
    table = Table("layer", "active", "detail", title="rstar2 sandbox isolation on this machine")
    for layer in hello["layers"]:
        table.add_row(
            layer["name"], "[green]yes[/green]" if layer["active"] else "[red]no[/red]", layer["detail"]
        )
    Console().print(table)
    Console().print(f"pre-imported modules: {', '.join(hello.get('preloaded', []))}")


@app.command("serve")
def sandbox_serve(
    host: str = typer.Option(
        "127.0.0.1", help="Address to bind. It runs untrusted code: keep it on loopback."
    ),
    port: int = typer.Option(DEFAULT_PORT, **ANY_PORT, help=PORT_HELP),
    workers: int = typer.Option(
        0, **WORKERS, help="Local sandbox workers (0 = one per CPU core). Ignored with --redis."
    ),
    redis: str | None = typer.Option(
        None,
        "--redis",
        help="Enqueue calls to Redis worker nodes at this URL: redis://:PASSWORD@HOST:6379/0 "
        "(or $RSTAR2_REDIS_PASSWORD; rediss:// for TLS).",
    ),
    timeout_s: float = TIMEOUT_OPTION,
    memory_mb: int = MEMORY_OPTION,
    deadline_s: float = typer.Option(
        DEADLINE_S, **above(0), help="Redis mode: a call gets a failure after this long."
    ),
    preload: str | None = typer.Option(None, help=PRELOAD_HELP),
    api_key: str | None = API_KEY,
) -> None:
    """Serve the sandbox over HTTP (POST /run, /run_batch; GET /health, /metrics)."""
    import uvicorn

    from ..auth import service_key
    from ..local_service import CannotListen, address, listen
    from .service import create_app

    if redis:
        from .redis_queue import RedisBackend, exposed_warning
    key, warning = service_key(api_key, host, "rstar2 sandbox serve")
    for said in (warning, exposed_warning(redis) if redis else None):
        if said:
            console.print(f"[yellow]\\[rstar2] {escape(said)}[/yellow]")
    # The port is bound before the workers start: a port taken is said at once (exit 2), and the
    # address said is read from the socket; a request that comes meanwhile waits for the workers.
    try:
        sock = listen(host, port)
    except CannotListen as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    console.print(f"rstar2 sandbox serve: listening on {address(sock)}", highlight=False)
    if redis:
        backend: Any = RedisBackend(redis, deadline_s=deadline_s)
    else:
        from .local_pool import LocalPool

        limits = Limits().merged(timeout_s, memory_mb)
        backend = LocalPool(workers=workers or None, limits=limits, preload=parse_preload(preload))
    uvicorn.Server(uvicorn.Config(create_app(backend, api_key=key), log_level="warning")).run(sockets=[sock])


@app.command("worker")
def sandbox_worker(
    redis: str = typer.Option(
        ...,
        "--redis",
        help="Redis URL, e.g. redis://:PASSWORD@head-node:6379/0 (or $RSTAR2_REDIS_PASSWORD; rediss:// for TLS).",
    ),
    workers: int = typer.Option(0, **WORKERS, help="Local sandbox workers (0 = one per CPU core)."),
    lease_s: float = typer.Option(
        LEASE_S, **above(0), help="A task held this long by a silent worker is given to another."
    ),
    timeout_s: float = TIMEOUT_OPTION,
    memory_mb: int = MEMORY_OPTION,
    preload: str | None = typer.Option(None, help=PRELOAD_HELP),
    name: str | None = typer.Option(None, help="Consumer name in Redis (default: host-pid-random)."),
) -> None:
    """Run a worker node: take calls from Redis, run them in isolation, send the results back."""
    from .local_pool import LocalPool
    from .redis_queue import RedisRefused, RedisWorker, exposed_warning, shown

    if said := exposed_warning(redis):
        console.print(f"[yellow]\\[rstar2] {escape(said)}[/yellow]")

    async def go() -> None:  # until SIGINT or SIGTERM
        limits = Limits().merged(timeout_s, memory_mb)
        pool = LocalPool(workers=workers or None, limits=limits, preload=parse_preload(preload))
        worker = RedisWorker(redis, pool, lease_s=lease_s, name=name)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, worker.stop)
        console.print(f"worker {worker.name}: {pool.size} sandbox workers, Redis {shown(redis)}")
        await worker.run()

    try:
        asyncio.run(go())
    except RedisRefused as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None

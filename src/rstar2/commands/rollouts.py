"""``rstar2 chat`` and ``rstar2 eval``: rollouts of a policy, their options made into the rollout
settings (``rollout_settings``) the one rollout path takes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from ..bounds import setting
from ..config import (
    CHAT_ROLLOUT,
    DEFAULT_EVAL,
    DEFAULT_ROLLOUT,
    DEFAULT_RUN,
    EVAL_ROLLOUT,
    NO_TOOLS,
    Columns,
    DataSection,
    EngineSection,
    EvalSection,
    RolloutSection,
    RunSection,
)
from ..config_files import ConfigError, put, set_value, validate
from .shared import MODEL_HELP, PROGRESS, console, failures

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


def max_response_tokens_option(preset: dict) -> Any:
    return typer.Option(
        None,
        "--max-response-tokens",
        "--max-tokens",
        **setting(RolloutSection, "max_response_tokens"),
        help=f"Response budget, model and tool tokens (default {preset['max_response_tokens']}).",
    )


STATEFUL = typer.Option(None, "--stateful", help="Also offer python_session.")
SYSTEM_PROMPT = typer.Option(None, help="System prompt ('' for none; default rstar2's).")
NO_TOOLS_OPTION = typer.Option(
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

# options of eval/chat that are rollout settings: the key each sets (of rollout:, or of its engine: or
# scheduler: section), the option's parameter named as its last part; an older spelling stays a second flag
ROLLOUT_OPTIONS = ("sandbox", "temperature", "top_p", "top_k", "max_turns", "verify_mode", "system_prompt")
ROLLOUT_OPTIONS += ("stateful", "engine.servers", "max_response_tokens", "banned_tokens")
ROLLOUT_OPTIONS += ("engine.max_batch_size", "engine.capacity_tokens", "scheduler.policy")


def rollout_settings(args: dict, preset: dict) -> RolloutSection:
    """The rollout settings of ``eval``/``chat`` from, in rising priority: RolloutSection's defaults,
    ``preset`` (no --config), the --config file's, ``config.NO_TOOLS`` (--no-tools), --set values, the
    options given (None: unset); a bad one is a usage error."""
    from ..recipe.spec import rollout_from_file

    try:
        # a preset's sections stay its own
        tree = copy.deepcopy(rollout_from_file(args["config"]) if args["config"] else preset)
        if args["no_tools"]:
            tree.update(NO_TOOLS)
        for item in args["set_"]:
            set_value(tree, item.removeprefix("rollout."))
        for key in ROLLOUT_OPTIONS:
            value = args.get(key.rpartition(".")[2])
            if value is not None and value != []:
                put(tree, key, value)
        return validate(RolloutSection, tree, "rollout settings")
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None


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
    max_response_tokens: int | None = max_response_tokens_option(CHAT_ROLLOUT),
    max_turns: int | None = MAX_TURNS,
    stateful: bool | None = STATEFUL,
    system_prompt: str | None = SYSTEM_PROMPT,
    no_tools: bool = NO_TOOLS_OPTION,
    config: Path | None = CONFIG,
    set_: list[str] = SET,
    device: str = DEVICE,
) -> None:
    """Talk to a model that uses the Python tool: each tool call, its output and the answer as they happen."""
    from ..rollout.chat_session import chat as chat_session

    settings = rollout_settings(locals(), CHAT_ROLLOUT)
    with failures():  # a server that refuses or is not there: exit 1; a bad tokenizer, device: exit 2
        chat_session(
            settings, model=model, tokenizer=tokenizer, device=device, problem=problem, out=Console()
        )


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
    max_response_tokens: int | None = max_response_tokens_option(EVAL_ROLLOUT),
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
    no_tools: bool = NO_TOOLS_OPTION,
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
    from ..eval.harness import run_eval

    settings = rollout_settings(locals(), EVAL_ROLLOUT)
    benches = [b.strip() for b in bench.split(",") if b.strip()]
    with failures():  # a bad source or column, a missing extra, settings the model cannot take: exit 2
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

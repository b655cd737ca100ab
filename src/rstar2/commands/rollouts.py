"""``rstar2 chat`` and ``rstar2 eval``: rollouts of a policy, their options made into the rollout
settings (``rollout_settings``) the one rollout path takes."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from ..bounds import setting
from ..config import (
    CHAT_ROLLOUT,
    DEFAULT_EVAL,
    DEFAULT_ROLLOUT,
    DEFAULT_RUN,
    EVAL_ROLLOUT,
    Columns,
    DataSection,
    EngineSection,
    EvalSection,
    RolloutSection,
    RunSection,
)
from ..config_files import validate
from .shared import (
    CONFIG,
    DEVICE,
    MAX_TURNS,
    MODEL,
    NO_TOOLS,
    PROGRESS,
    SANDBOX,
    SERVERS,
    SET,
    STATEFUL,
    SYSTEM_PROMPT,
    TOKENIZER,
    TOP_P,
    console,
    failures,
)

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
    from ..config_files import ConfigError
    from ..config_files import rollout_settings as merge
    from ..recipe.spec import rollout_from_file

    options = {rollout_key(name): args[name] for name in ROLLOUT_OPTIONS if name in args}
    try:
        file_tree = rollout_from_file(args["config"]) if args["config"] else None
        return merge(file_tree, args["set_"], preset, args["no_tools"], **options)
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

"""Wiring for the commands: engines + chat format + code environment + verifier → a ``Rollout``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from ..chat.format import ChatFormat
from .runner import Rollout, RolloutConfig


@dataclass
class RolloutSetup:
    model: str | None = None  # a local Hugging Face model directory (in-process HFEngine)
    servers: Sequence[str] = ()  # OpenAI-compatible servers (vLLM, SGLang, rstar2 serve)
    tokenizer: str | None = None  # defaults to the model directory
    sandbox: str | None = None  # URL of `rstar2 sandbox serve`; default: a local pool
    sandbox_workers: int | None = None
    verifier_workers: int = 2
    device: str = "auto"
    dtype: str = "auto"
    max_batch_size: int = 64
    capacity_tokens: int | None = None  # KV tokens per engine; None: what each engine reports
    stateful: bool = False
    tool_limit_chars: int = 2048
    tool_traceback_lines: int = 12
    tool_limit_tokens: int | None = None
    system_prompt: str | None = None  # None: rstar2's default system prompt
    user_prefix: str | None = None  # None: rstar2's default words before the problem
    tools_in_prompt: bool = True
    config: RolloutConfig = field(default_factory=RolloutConfig)


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@asynccontextmanager
async def open_rollout(
    setup: RolloutSetup,
    engines: Sequence[Any] | None = None,
    tokenizer: Any = None,
    executor: Any = None,
    verifier: Any = None,
) -> AsyncIterator[Rollout]:
    """A ready ``Rollout``; ``engines`` and ``tokenizer`` given by the caller (the trainer, whose
    engine shares its model) replace those the setup would load; so do a running ``executor``
    (code environment) and ``verifier`` pool, which stay open (a recipe shares them by stage)."""
    from ..engines.hf import HFEngine
    from ..engines.openai import OpenAIEngine
    from ..reward import VerifierPool
    from ..sandbox import LocalPool
    from ..sandbox.client import Client

    if engines is None and bool(setup.model) == bool(setup.servers):
        raise ValueError("give either a model directory (--model) or one or more servers (--server)")
    tok_path = setup.tokenizer or setup.model
    if tok_path is None and tokenizer is None:
        raise ValueError("with --server, give --tokenizer PATH (the served model's tokenizer directory)")
    fmt = ChatFormat(
        tokenizer if tokenizer is not None else load_tokenizer(tok_path),
        system_prompt=setup.system_prompt,
        user_prefix=setup.user_prefix,
        stateful=setup.stateful,
        tools_in_prompt=setup.tools_in_prompt,
        tool_limit_chars=setup.tool_limit_chars,
        tool_traceback_lines=setup.tool_traceback_lines,
        tool_limit_tokens=setup.tool_limit_tokens,
    )
    own = engines is None
    if not own:
        engines = list(engines)
    elif setup.model:
        engines = [
            HFEngine.from_pretrained(
                setup.model,
                device=setup.device,
                dtype=setup.dtype,
                max_batch_size=setup.max_batch_size,
                capacity_tokens=setup.capacity_tokens,
            )
        ]
    else:
        engines = [OpenAIEngine(url, capacity_tokens=setup.capacity_tokens) for url in setup.servers]
    for engine in engines:  # servers state their KV capacity (vLLM /metrics, SGLang server info)
        if hasattr(engine, "probe_capacity"):
            await engine.probe_capacity()
    own_executor, own_verifier = executor is None, verifier is None
    if own_executor:
        executor = Client(setup.sandbox) if setup.sandbox else LocalPool(workers=setup.sandbox_workers)
        await executor.start()
    if own_verifier:
        verifier = VerifierPool(setup.verifier_workers).start()
    try:
        yield Rollout(engines, fmt, executor, verifier, setup.config)
    finally:
        if own_verifier:
            verifier.close()
        if own_executor:
            await executor.close()
        for e in engines if own else []:
            await e.close()

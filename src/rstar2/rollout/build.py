"""The one place where rollout settings (``RolloutSection``) become a running ``Rollout``: engines
(``engines/kinds.py``), chat format, code environment and verifier. The RL trainer, the recipe's
filters and evaluations, and the ``eval``/``chat`` commands all come through here, so they sample
the same way."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from ..chat.format import ChatFormat
from ..config import RolloutSection
from ..engines.kinds import open_engines
from .multi_turn import CodeEnvironment, RewardFn, Rollout, Verifier


def check_engine_choice(model: str | None, settings: RolloutSection, tokenizer: str | None) -> None:
    """A local model directory or servers, not both; with servers, a tokenizer."""
    from pathlib import Path

    if bool(model) == bool(settings.engine.servers):
        raise ValueError("give either --model PATH or --servers URL")
    if model and not Path(model).is_dir():
        raise ValueError(f"--model {model} does not exist (a local Hugging Face model folder)")
    if settings.engine.servers and not (tokenizer or model):
        raise ValueError("with --servers, give --tokenizer PATH (the served model's tokenizer)")


@asynccontextmanager
async def open_services(
    settings: RolloutSection, code_env: CodeEnvironment | None = None, verifier: Verifier | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The code environment (``settings.sandbox``: the HTTP service, else a local pool) and the
    verifier pool, as the ``code_env``/``verifier`` keywords of ``open_rollout``; one given by the
    caller is passed through and left open."""
    from ..reward import VerifierPool
    from ..sandbox import LocalPool
    from ..sandbox.client import Client

    own_code_env, own_verifier = code_env is None, verifier is None
    try:
        if own_code_env:
            code_env = (
                Client(settings.sandbox) if settings.sandbox else LocalPool(workers=settings.sandbox_workers)
            )
            await code_env.start()
        if own_verifier:
            verifier = VerifierPool(settings.verifier_workers).start()
        yield {"code_env": code_env, "verifier": verifier}
    finally:
        if own_verifier and verifier is not None:
            verifier.close()
        if own_code_env and code_env is not None:
            await code_env.close()


@asynccontextmanager
async def open_rollout(
    settings: RolloutSection,
    *,
    model: str | None = None,
    tokenizer: Any = None,
    device: str = "auto",
    dtype: str = "auto",
    engines: Sequence[Any] | None = None,
    code_env: CodeEnvironment | None = None,
    verifier: Verifier | None = None,
    reward: RewardFn | None = None,
) -> AsyncIterator[Rollout]:
    """A ready ``Rollout``. ``model``: a local model directory for the in-process engine (and the
    tokenizer's default); ``tokenizer``: a directory or a loaded tokenizer. ``engines`` given by
    the caller (the trainer, whose engine shares its model) replace those of the settings; so do a
    running ``code_env`` and ``verifier`` (a recipe shares them by stage), which stay open.
    ``reward``: a custom reward (the RL trainer's ``reward:``), scoring in the verifier's place."""
    if tokenizer is None and model is None:
        raise ValueError("with --servers, give --tokenizer PATH (the served model's tokenizer directory)")
    if tokenizer is None or isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer or model))
    fmt = ChatFormat.from_settings(tokenizer, settings)
    own = engines is None
    engines = await open_engines(settings.engine, model, device, dtype) if own else list(engines)
    try:
        async with open_services(settings, code_env, verifier) as services:
            rollout = Rollout(
                engines, fmt, services["code_env"], services["verifier"], settings, reward=reward
            )
            try:
                yield rollout
            finally:
                rollout.close()
    finally:
        for e in engines if own else []:
            await e.close()

"""The one place where rollout settings become a running ``Rollout`` (engines, chat format, code
environment, verifier): the RL trainer, the recipe, ``eval`` and ``chat`` all come through here, so
they sample the same way."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from ..chat.format import ChatFormat
from ..config import RolloutSection
from ..engines.kinds import open_engines
from .multi_turn import CodeEnvironment, RewardFn, Rollout, Verifier


def check_engine_choice(model: str | None, settings: RolloutSection, tokenizer: str | None) -> None:
    """A local model directory or servers, not both; with servers, a tokenizer."""
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
    """The code environment (``settings.sandbox``'s service, else a local pool) and the verifier pool
    for ``open_rollout``; one given by the caller is passed through and left open."""
    from ..reward import VerifierPool
    from ..sandbox import LocalPool
    from ..sandbox.client import Client

    async with AsyncExitStack() as owned:  # closed in reverse: the verifier, then the code environment
        if code_env is None:
            code_env = (
                Client(settings.sandbox) if settings.sandbox else LocalPool(workers=settings.sandbox_workers)
            )
            owned.push_async_callback(code_env.close)  # also when it fails to start
            await code_env.start()
        if verifier is None:
            verifier = VerifierPool(settings.verifier_workers).start()
            owned.callback(verifier.close)
        yield {"code_env": code_env, "verifier": verifier}


@asynccontextmanager
async def open_rollout(
    settings: RolloutSection,
    *,
    model: str | None = None,
    tokenizer: Any = None,
    device: str = "auto",
    engines: Sequence[Any] | None = None,
    code_env: CodeEnvironment | None = None,
    verifier: Verifier | None = None,
    reward: RewardFn | None = None,
) -> AsyncIterator[Rollout]:
    """A ready ``Rollout``. ``model``: a local model directory for the in-process engine (and the
    tokenizer's default); ``tokenizer``: a directory or a loaded one. ``engines``, ``code_env`` and
    ``verifier`` given by the caller replace those of the settings, and stay open."""
    if tokenizer is None and model is None:
        raise ValueError("with --servers, give --tokenizer PATH (the served model's tokenizer directory)")
    if tokenizer is None or isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer or model))
    fmt = ChatFormat.from_settings(tokenizer, settings)
    async with AsyncExitStack() as owned:
        if engines is None:
            engines = await open_engines(settings.engine, model, device)
            for e in reversed(engines):  # closed in order, after the services
                owned.push_async_callback(e.close)
        services = await owned.enter_async_context(open_services(settings, code_env, verifier))
        rollout = Rollout(engines, fmt, services["code_env"], services["verifier"], settings, reward=reward)
        owned.callback(rollout.close)
        yield rollout

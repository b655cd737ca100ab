"""The kinds of engine, in one table, and the one place engines are opened. A server at a URL is
the first kind in ``SERVED`` whose ``serves(url)`` says yes; a local model folder (or the trainer's
own model) is decoded by ``IN_PROCESS``. A new engine is a file with a class keeping the ``Engine``
contract (``engines/base.py``) and one line here. A server kind also answers ``serves(url)`` (a
class method), is made as ``Kind(url, capacity_tokens=, timeout_s=, reload_path=)`` (and ``weights_url=`` where the
run sets one: its servers fetch new weights from the trainer over HTTP) and asked
``probe_capacity()``; the in-process kind is made over a loaded model (``Kind(model, name=, ...)``)
or ``Kind.from_pretrained(folder, device=, dtype=, ...)``."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ..config import DEFAULT_ASYNC, DEFAULT_ROLLOUT, EngineSection
from .base import Engine

SERVED = [  # tried in order: the last, any OpenAI-compatible server, says yes to every URL
    "rstar2.engines.vllm:VLLMEngine",
    "rstar2.engines.openai:OpenAIEngine",
]
IN_PROCESS = "rstar2.engines.hf:HFEngine"


def kind(path: str) -> Any:
    """The class a table line names (imported only when used: vLLM's needs no torch, HF's no httpx)."""
    module, name = path.split(":")
    return getattr(import_module(module), name)


async def connect(url: str, settings: EngineSection = DEFAULT_ROLLOUT.engine) -> Engine:
    """The engine of the server at ``url``, of the first kind that serves it, once it has asked
    the server for its KV capacity (``settings.capacity_tokens`` where given)."""
    for path in SERVED:
        served = kind(path)
        if await served.serves(url):
            break
    else:
        raise ValueError(f"no kind of engine in engines/kinds.py serves {url}")
    fetch = {"weights_url": settings.weights_url} if settings.weights_url else {}
    engine = served(
        url,
        capacity_tokens=settings.capacity_tokens,
        timeout_s=settings.server_timeout_s,
        reload_path=settings.reload_path,
        **fetch,
    )
    try:
        await engine.probe_capacity()
    except BaseException:
        await engine.close()
        raise
    return engine


async def open_engines(
    settings: EngineSection,
    model: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    *,
    trainer_model: Any = None,
    name: str = "hf",
    compute: str = "auto",
    keep_stale_kv: bool = DEFAULT_ASYNC.keep_stale_kv,
) -> list[Engine]:
    """``settings.servers``, each connected, or one in-process engine: over a loaded model the
    caller keeps training (``trainer_model``, so new weights cost nothing to publish), else loaded
    from the directory ``model``."""
    if settings.servers:
        engines: list[Engine] = []
        try:
            for url in settings.servers:
                engines.append(await connect(url, settings))
        except BaseException:
            for e in engines:
                await e.close()
            raise
        return engines
    local = kind(IN_PROCESS)
    sizes = {
        "max_batch_size": settings.max_batch_size,
        "capacity_tokens": settings.capacity_tokens,
        "keep_tokens": settings.keep_tokens,
        "compute": compute,
        "keep_stale_kv": keep_stale_kv,
        "cuda_graphs": settings.cuda_graphs,
    }
    if trainer_model is not None:
        return [local(trainer_model, name=name, **sizes)]
    if not model:
        raise ValueError("give either a model directory (--model) or one or more servers (--servers)")
    return [local.from_pretrained(model, device=device, dtype=dtype, **sizes)]

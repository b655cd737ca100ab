"""The kinds of engine, in one table, and the one place engines are opened. A server at a URL is
the first served kind whose ``serves(url)`` says yes; a local model folder (or the trainer's own
model) is decoded by the in-process kind ``rollout.engine.kind`` names (``hf`` by default).

The table is rstar2's own kinds plus those other installed packages declare under the entry point
group ``rstar2.engines`` (``name = "module:Class"`` in their ``pyproject.toml``): an engine of a
user's own is registered without editing rstar2. A class with ``local = False`` is a served kind
(tried before rstar2's, so that it can claim its own URLs before the OpenAI-compatible kind, which
says yes to every URL); one with ``local = True`` an in-process kind, chosen by its name. What a
kind keeps is the ``Engine`` contract (``engines/base.py``, and docs/engines.md's "your own engine")."""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points
from pkgutil import resolve_name
from typing import Any

from ..config import DEFAULT_ASYNC, DEFAULT_ROLLOUT, EngineSection
from .base import Engine

ENTRY_POINTS = "rstar2.engines"
# "module:Class", imported only when used (vLLM's needs no torch, HF's no httpx)
SERVED = [  # tried in order: the last, any OpenAI-compatible server, says yes to every URL
    "rstar2.engines.vllm:VLLMEngine",
    "rstar2.engines.openai:OpenAIEngine",
]
IN_PROCESS = {"hf": "rstar2.engines.hf:HFEngine"}


@cache
def installed() -> dict[str, Any]:
    """The engine kinds other packages declare (``rstar2.engines`` entry points), by name."""
    return {ep.name: ep.load() for ep in entry_points(group=ENTRY_POINTS)}


def in_process_kind(name: str) -> Any:
    """The in-process kind called ``name``: rstar2's own (``hf``) or an installed one."""
    if name in IN_PROCESS:
        return resolve_name(IN_PROCESS[name])
    found = installed().get(name)
    if found is None or not found.local:
        known = sorted([*IN_PROCESS, *(n for n, k in installed().items() if k.local)])
        raise ValueError(
            f"no in-process engine kind {name!r} (known: {', '.join(known)}; a package adds one as an "
            f"entry point in the group {ENTRY_POINTS!r})"
        )
    return found


async def connect(url: str, settings: EngineSection = DEFAULT_ROLLOUT.engine) -> Engine:
    """The engine of the server at ``url``, of the first kind that serves it, once it has asked
    the server for its KV capacity (``settings.capacity_tokens`` where given)."""
    for served in [k for k in installed().values() if not k.local] + [resolve_name(p) for p in SERVED]:
        if await served.serves(url):
            break
    else:
        raise ValueError(f"no kind of engine serves {url}")
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
    local = in_process_kind(settings.kind)
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

"""Isolated, fast execution of model-written Python: local pool, HTTP service, Redis workers, client.
Names are imported on first use, so the sandbox worker (``python -m rstar2.sandbox.worker``) does not
load the pool's asyncio machinery: every module a worker holds makes each forked call dearer."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = ["STATUSES", "ExecRequest", "ExecResult", "IsolationConfig", "Limits", "LocalPool"]
_WHERE = {
    "IsolationConfig": ".isolation",
    "LocalPool": ".local_pool",
    "STATUSES": ".result",
    "ExecRequest": ".request",
    "ExecResult": ".result",
    "Limits": ".request",
}

if TYPE_CHECKING:
    from .isolation import IsolationConfig
    from .local_pool import LocalPool
    from .request import ExecRequest, Limits
    from .result import STATUSES, ExecResult


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Isolated, fast execution of model-written Python: local pool, HTTP service, Redis workers, client."""

from .isolation import IsolationConfig
from .pool import LocalPool
from .result import STATUSES, ExecRequest, ExecResult, Limits

__all__ = ["STATUSES", "ExecRequest", "ExecResult", "IsolationConfig", "Limits", "LocalPool"]

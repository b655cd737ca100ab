"""Which engine serves a trajectory's next turn. One interface, pluggable policies.

A policy is asked for an engine before each generation request (``acquire``) and told when the
request is answered (``release``). ``LeastLoaded`` picks the engine with the fewest requests in
flight and, on a tie, the one that served the trajectory's previous turn (its prefix may still be
cached). The KV-cache-capacity scheduler implements the same two calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..engines.base import Engine


@dataclass
class Request:
    """What a policy may look at: who asks, how long its context is, how much it may generate."""

    trajectory: str
    context_tokens: int
    max_new_tokens: int
    previous: Engine | None = None


class DispatchPolicy(Protocol):
    engines: Sequence[Engine]

    async def acquire(self, request: Request) -> Engine: ...

    def release(self, engine: Engine, request: Request) -> None: ...


class LeastLoaded:
    """Fewest requests in flight (counted here, so requests of other users do not skew it)."""

    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ValueError("at least one engine is needed")
        self.engines = list(engines)
        self._load = {id(e): 0 for e in self.engines}

    def load(self, engine: Engine) -> int:
        return self._load[id(engine)]

    async def acquire(self, request: Request) -> Engine:
        best = min(self._load[id(e)] for e in self.engines)
        prev = request.previous
        if prev is not None and id(prev) in self._load and self._load[id(prev)] == best:
            engine = prev
        else:
            engine = next(e for e in self.engines if self._load[id(e)] == best)
        self._load[id(engine)] += 1
        return engine

    def release(self, engine: Engine, request: Request) -> None:
        self._load[id(engine)] -= 1


POLICIES = {"least_loaded": LeastLoaded}

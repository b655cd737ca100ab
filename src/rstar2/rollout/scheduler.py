"""Which engine serves a trajectory's next turn, and when. A *policy* decides, from a global queue of
requests (a turn, or the rest of one), which may start now and on which engine. Policies are plain
synchronous objects (``submit`` / ``admit`` / ``release``), so the same code runs the real rollouts
(through the asyncio ``Scheduler``) and the discrete-event model (``benchmarks/scheduler_model.py``)."""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import DEFAULT_SCHEDULER
from ..engines.base import Engine


class NoEngineError(RuntimeError):
    """No engine can ever serve the request: it needs more KV tokens than the largest engine holds."""


REVIVE_BACKOFF_S = 10.0  # the longest wait between two tries to bring a failed engine back (RL)
REVIVE_AFTER_S = 60.0  # without ``Scheduler.revive``: a failed engine back as it is, in case it restarted

# The kv policy's grant when ``rollout.scheduler.grant_tokens`` leaves it open (``grant_budget``)
GRANT_TOKENS, GRANT_SHARE = 512, 64


def grant_budget(capacities: Sequence[int], prefix_cache: bool = True) -> int:
    """New tokens the kv policy grants an admitted request when the settings leave it open: a
    turn in slices, so that many requests share the KV, where an engine keeps each slice's prefix
    for the next; where none does, a slice would prefill the whole turn again, so it is granted whole."""
    if not prefix_cache:
        return max(capacities)
    return max(1, min(GRANT_TOKENS, min(capacities) // GRANT_SHARE))


class EngineDown(RuntimeError):
    """Every engine failed, and none came back holding the current weights: nothing can be sampled."""


@dataclass
class Request:
    """One generation request (a turn, or the rest of one). ``previous``: the engine (an index inside
    policies) of the trajectory's last request. ``granted``: new tokens it may generate, set on
    admission (``max_new_tokens`` unless the kv policy grants less)."""

    trajectory: str
    context_tokens: int
    max_new_tokens: int
    previous: Any = None
    turn: int = 0
    seq: int = field(default=-1, compare=False)  # arrival order, set by ``submit``
    bypassed: int = field(default=0, compare=False)
    granted: int = field(default=0, compare=False)

    @property
    def reservation(self) -> int:
        return self.context_tokens + (self.granted or self.max_new_tokens)


class Policy:
    """Book-keeping shared by every policy: capacities, reservations, requests in flight, the queue."""

    name = "policy"

    def __init__(self, capacities: Sequence[int]) -> None:
        if not capacities:
            raise ValueError("at least one engine is needed")
        if any(c <= 0 for c in capacities):
            raise ValueError(f"engine capacities must be positive, got {list(capacities)}")
        self.capacity = [int(c) for c in capacities]
        self.reserved = [0] * len(capacities)
        self.running = [0] * len(capacities)
        self.alive = [True] * len(capacities)
        self.queue: list[Request] = []
        self._seq = itertools.count()
        self.rejected: list[tuple[Request, str]] = []  # requests no engine can ever take

    def open(self, trajectory: str) -> None:
        """A trajectory's life starts (only ``static`` needs to know)."""

    def close(self, trajectory: str) -> None:
        """A trajectory's life ends."""

    def submit(self, request: Request) -> Request:
        if request.max_new_tokens < 1 or request.context_tokens < 0:
            raise ValueError(
                f"a request needs context >= 0 and max_new_tokens >= 1, got {request.context_tokens} "
                f"and {request.max_new_tokens}"
            )
        request.seq = next(self._seq)
        self.queue.append(request)
        return request

    def withdraw(self, request: Request) -> None:
        """A waiting request that is no longer wanted (its caller was cancelled)."""
        self.queue = [r for r in self.queue if r is not request]

    def admit(self) -> list[tuple[Request, int]]:
        """Requests that may start now, each with its engine; they leave the queue."""
        raise NotImplementedError

    def _start(self, request: Request, engine: int, granted: int | None = None) -> tuple[Request, int]:
        request.granted = granted or request.max_new_tokens
        self.reserved[engine] += request.reservation
        self.running[engine] += 1
        return request, engine

    def release(self, engine: int, request: Request) -> None:
        self.reserved[engine] -= request.reservation
        self.running[engine] -= 1

    def remove_engine(self, engine: int) -> None:
        """Out of rotation (it stopped answering); turns in flight there are re-submitted by callers."""
        self.alive[engine] = False

    def live(self) -> list[int]:
        return [e for e, ok in enumerate(self.alive) if ok]

    def free(self, engine: int) -> int:
        return self.capacity[engine] - self.reserved[engine]


class LeastRequests(Policy):
    """verl's: fewest requests in flight; on a tie the previous turn's engine (its prefix may be cached)."""

    name = "least_requests"

    def admit(self) -> list[tuple[Request, int]]:
        live = self.live()
        if not live:
            return []
        # the first least busy engine, the previous one if among them
        out = [
            self._start(r, min(live, key=lambda e: (self.running[e], e != r.previous))) for r in self.queue
        ]
        self.queue = []
        return out


class Static(Policy):
    """Equal split up front (trajectory i → engine i mod E) and a barrier per turn: turn t starts only
    when every open trajectory has finished turn t-1 and its tool call, or has ended. What
    rStar2-Agent started from, and found to leave GPUs idle and overflow their KV caches."""

    name = "static"

    def __init__(self, capacities: Sequence[int]) -> None:
        super().__init__(capacities)
        self.home: dict[str, int] = {}
        self.turn_of: dict[str, int] = {}  # open trajectories → the turn they last asked for
        self._next_home = itertools.count()

    def open(self, trajectory: str) -> None:
        if trajectory not in self.home:
            self.home[trajectory] = next(self._next_home) % len(self.capacity)
        self.turn_of.setdefault(trajectory, 0)

    def close(self, trajectory: str) -> None:
        self.turn_of.pop(trajectory, None)

    def submit(self, request: Request) -> Request:
        self.open(request.trajectory)
        self.turn_of[request.trajectory] = max(self.turn_of[request.trajectory], request.turn)
        return super().submit(request)

    def admit(self) -> list[tuple[Request, int]]:
        live = self.live()
        if not live or not self.queue:
            return []
        barrier = min(self.turn_of.values(), default=0)
        out, waiting = [], []
        for req in self.queue:
            if req.turn > barrier:
                waiting.append(req)
                continue
            engine = self.home[req.trajectory]
            if not self.alive[engine]:  # its engine failed: the next live one in line takes it
                engine = live[engine % len(live)]
            out.append(self._start(req, engine))
        self.queue = waiting
        return out


class KVCapacity(Policy):
    """The default: a request is admitted only if its context plus the tokens it is granted fit the
    engine's free KV; a next request goes back to the engine holding its prefix unless that engine
    is short of room while another is mostly free, or runs ``rebalance_gap`` more requests than
    another; the oldest waiting request is passed over at most ``max_bypass`` times."""

    name = "kv"

    def __init__(
        self,
        capacities: Sequence[int],
        *,
        grant_tokens: int | None = None,
        spill_free_share: float = 0.5,
        rebalance_gap: int | None = 4,
        max_bypass: int = 64,
    ) -> None:
        super().__init__(capacities)
        if not 0 <= spill_free_share <= 1:
            raise ValueError(f"spill_free_share must be in [0, 1], got {spill_free_share}")
        if grant_tokens is None:
            grant_tokens = grant_budget(self.capacity)
        if grant_tokens < 1:
            raise ValueError(f"grant_tokens must be at least 1, got {grant_tokens}")
        self.grant_tokens = grant_tokens
        self.spill_free_share = spill_free_share
        self.rebalance_gap = rebalance_gap
        self.max_bypass = max_bypass

    def need(self, req: Request) -> int:
        """The reservation: context + the turn's new tokens, at most ``grant_tokens`` of them."""
        return req.context_tokens + min(req.max_new_tokens, self.grant_tokens)

    def _choose(self, req: Request) -> int | None:
        need = self.need(req)
        fits = [e for e in self.live() if self.free(e) >= need]
        if not fits:
            return None
        prev = req.previous
        if prev is not None and self.alive[prev] and self.capacity[prev] >= need:
            if prev in fits:
                least = min(fits, key=lambda e: (self.running[e], -self.free(e) / self.capacity[e]))
                gap = self.running[prev] - self.running[least]
                if self.rebalance_gap is None or gap < self.rebalance_gap:
                    return prev
                return least  # a much less busy engine decodes this turn faster than the cached prefix saves
            # the prefix's engine is short of room: move only to an engine that is mostly free
            roomy = [e for e in fits if self.free(e) >= self.spill_free_share * self.capacity[e]]
            if not roomy:
                return None
            fits = roomy
        # the emptiest engine by share, so that a small engine is not left idle beside a big one
        return max(fits, key=lambda e: (self.free(e) / self.capacity[e], -self.running[e], -e))

    def admit(self) -> list[tuple[Request, int]]:
        live = self.live()
        if not live or not self.queue:
            return []
        largest = max(self.capacity[e] for e in live)
        out: list[tuple[Request, int]] = []
        waiting: list[tuple[Request, int]] = []  # with the number admitted before it was passed over
        for i, req in enumerate(self.queue):
            need = self.need(req)
            if need > largest:
                why = (
                    f"a request needs at least {need} KV tokens ({req.context_tokens} of context + "
                    f"{need - req.context_tokens} new) but the largest engine holds {largest}: raise "
                    "the engines' capacity_tokens or lower max_response_tokens"
                )
                self.rejected.append((req, why))
                continue
            oldest, before = waiting[0] if waiting else (None, 0)
            if oldest is not None and oldest.bypassed + len(out) - before >= self.max_bypass:
                waiting.extend((r, len(out)) for r in self.queue[i:])  # hold the line for the oldest
                break
            engine = self._choose(req) if need <= max(self.free(e) for e in live) else None
            if engine is None:
                waiting.append((req, len(out)))
                continue
            out.append(self._start(req, engine, need - req.context_tokens))
        for req, before in waiting:
            req.bypassed += len(out) - before
        self.queue = [req for req, _ in waiting]
        return out


POLICIES: dict[str, type[Policy]] = {"kv": KVCapacity, "least_requests": LeastRequests, "static": Static}


def make_policy(name: str, capacities: Sequence[int], **options: Any) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown scheduler {name!r}; choose one of {sorted(POLICIES)}")
    return POLICIES[name](capacities, **options)


class Scheduler:
    """A policy over real engines, for asyncio callers: ``acquire`` an engine, ``release`` it, ``fail`` it."""

    def __init__(
        self,
        engines: Sequence[Engine],
        policy: str = DEFAULT_SCHEDULER.policy,
        *,
        grant_tokens: int | None = None,
        revive_for_s: float = DEFAULT_SCHEDULER.revive_for_s,
    ) -> None:
        """``grant_tokens``: ``kv``'s (None: ``grant_budget``). ``revive``, set by the RL trainer, brings a
        failed engine back: it must load the current weights into it, or raise."""
        self.engines = list(engines)
        self.revive_for_s = revive_for_s
        self.revive: Callable[[Engine], Awaitable[None]] | None = None
        self.down: str | None = None  # why nothing can be sampled any more (every engine is out)
        self._reviving: dict[int, asyncio.Task] = {}
        self._gone: dict[int, str] = {}  # engines that did not come back (out for good), and why
        if not self.engines:
            raise ValueError("at least one engine is needed")
        options = {}
        if policy == "kv":
            if grant_tokens is None:
                caches = any(getattr(e, "prefix_cache", True) for e in self.engines)
                grant_tokens = grant_budget([e.capacity_tokens for e in self.engines], caches)
            options["grant_tokens"] = grant_tokens
        self.policy = make_policy(policy, [e.capacity_tokens for e in self.engines], **options)
        self._index = {id(e): i for i, e in enumerate(self.engines)}
        self._waiting: dict[int, asyncio.Future] = {}  # submitted, not yet admitted
        self._held: dict[int, Request] = {}  # admitted, not yet released
        self.admitted = 0

    def open(self, trajectory: str) -> None:
        self.policy.open(trajectory)

    def close(self, trajectory: str) -> None:
        self.policy.close(trajectory)
        self._pump()

    async def acquire(self, request: Request) -> Engine:
        if self.down:
            raise EngineDown(self.down)
        req = self.policy.submit(replace(request, previous=self._index.get(id(request.previous))))
        fut = asyncio.get_running_loop().create_future()
        self._waiting[req.seq] = fut
        self._pump()
        try:
            engine = await fut
        except BaseException:  # cancelled, or no engine left
            self._waiting.pop(req.seq, None)
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.policy.release(fut.result(), req)  # admitted just as we were cancelled
            else:
                self.policy.withdraw(req)
            self._pump()
            raise
        request.seq, request.granted = req.seq, req.granted  # ``release`` finds the policy's copy by seq
        self._held[req.seq] = req
        return self.engines[engine]

    def release(self, engine: Engine, request: Request) -> None:
        req = self._held.pop(request.seq, None)
        if req is not None:
            self.policy.release(self._index[id(engine)], req)
        self._pump()

    def fail(self, engine: Engine, why: str = "") -> bool:
        """``engine`` failed a request: True when the caller may retry the turn. With ``revive`` it is
        out of rotation, the last one too, until ``revive`` has loaded the current weights into it
        (tried for ``revive_for_s``; then it is out for good). Without, it is back after
        ``REVIVE_AFTER_S``, and the last one left stays: its turns fail one by one instead."""
        i = self._index[id(engine)]
        if self.revive is not None:
            if self.down or i in self._gone:
                return bool(self.policy.live()) and not self.down
            if i not in self._reviving:
                print(
                    f"[rstar2] engine {engine.name} failed ({why[:300]}): out of rotation until it holds "
                    "the current weights",
                    file=sys.stderr,
                )
                self.policy.remove_engine(i)
                self._reviving[i] = asyncio.get_running_loop().create_task(self._bring_back(i))
            return True
        if not self.policy.alive[i] or self.policy.live() == [i]:
            return False
        self.policy.remove_engine(i)
        asyncio.get_running_loop().call_later(REVIVE_AFTER_S, self._revive, i)
        self._pump()
        return True

    def _revive(self, i: int) -> None:
        self.policy.alive[i] = True
        self._pump()

    def in_rotation(self, engine: Engine) -> bool:
        """Whether ``engine`` serves turns now (not failed, or brought back since)."""
        return self.policy.alive[self._index[id(engine)]]

    def restore(self, engine: Engine) -> None:
        """``engine`` holds the current weights again: back in rotation at once (``revive`` calls this
        before it lets weights be published again, so no version passes it by)."""
        i = self._index[id(engine)]
        self._reviving.pop(i, None)
        self._revive(i)

    async def _bring_back(self, i: int) -> None:
        assert self.revive is not None
        loop, engine = asyncio.get_running_loop(), self.engines[i]
        deadline, delay = loop.time() + self.revive_for_s, 1.0
        while True:
            await asyncio.sleep(delay)
            try:  # a hung server does not hold it past the deadline
                await asyncio.wait_for(self.revive(engine), max(1.0, deadline - loop.time()))
            except Exception as exc:  # noqa: BLE001 - said when it gives up
                why = f"{type(exc).__name__}: {exc}"
                if loop.time() + delay > deadline:
                    break
                delay = min(2 * delay, REVIVE_BACKOFF_S)
                continue
            if self._reviving.get(i) is asyncio.current_task():  # not yet put back by ``restore``
                del self._reviving[i]
                self._revive(i)
            print(f"[rstar2] engine {engine.name} is back, holding the current weights", file=sys.stderr)
            return
        self._reviving.pop(i, None)
        self._out_for_good(i, f"did not come back within {self.revive_for_s:.0f} s", why)

    def retire(self, engine: Engine, why: str) -> None:
        """``engine`` is out for good, not to be revived: it does not compute the weights it says it
        holds, and loading them again would be taken at its word again."""
        i = self._index[id(engine)]
        if i in self._gone:
            return
        task = self._reviving.pop(i, None)
        if task is not None:
            task.cancel()
        self.policy.remove_engine(i)
        self._out_for_good(i, "does not serve the weights it says it holds", why)

    def _out_for_good(self, i: int, what: str, why: str) -> None:
        """Engine ``i`` gone; once none is left or coming back, every waiting request fails."""
        self._gone[i] = why
        print(f"[rstar2] engine {self.engines[i].name} {what}: out for good ({why[:300]})", file=sys.stderr)
        if not self.policy.live() and not self._reviving:
            each = "; ".join(f"{self.engines[j].name} ({w[:300]})" for j, w in sorted(self._gone.items()))
            self.down = f"every engine failed and none came back holding the current weights: {each}"
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(EngineDown(self.down))

    async def stop_reviving(self) -> None:
        """Stop bringing engines back (the run is over)."""
        for task in list(self._reviving.values()):
            task.cancel()
        await asyncio.gather(*self._reviving.values(), return_exceptions=True)
        self._reviving.clear()

    def _pump(self) -> None:
        for req, engine in self.policy.admit():
            fut = self._waiting.pop(req.seq, None)
            if fut is None or fut.done():
                self.policy.release(engine, req)
                continue
            self.admitted += 1
            fut.set_result(engine)
        for req, why in self.policy.rejected:
            fut = self._waiting.pop(req.seq, None)
            if fut is not None and not fut.done():
                fut.set_exception(NoEngineError(why))
        self.policy.rejected.clear()

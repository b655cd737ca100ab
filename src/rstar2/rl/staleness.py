"""Asynchronous RL with bounded staleness: which groups of rollouts may start, the feed that starts
them while the trainer updates, and how old the trained tokens were.

Group ``i`` of a run (counted from its first step, ``batch_size`` groups a step) is trained at step
``i // batch_size`` by the policy of that version (the number of updates before it). It may start
sampling while the policy is at version ``v`` only if ``i // batch_size - v <= k``
(``asynchronous.max_staleness``): every token it samples, under any version ``>= v``, is then at most
``k`` updates older than the policy it trains. The bound is kept at admission; no finished rollout
is thrown away. At ``k = 0`` a step's groups start only after the previous update: the synchronous
loop, the same tokens and weights.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable, Sequence
from typing import Any


def admissible(group: int, *, version: int, batch_size: int, max_staleness: int) -> bool:
    """May group ``group`` start while the policy is at ``version``?"""
    return group // batch_size - version <= max_staleness


class StalenessError(RuntimeError):
    """A step would train on tokens sampled outside [version - k, version]."""


def require_reported_versions(engines: Sequence[Any], max_staleness: int) -> None:
    """At the run's start: every engine must say which policy version sampled its tokens. One that
    only states the version it holds (asked before and after each request) will do at
    ``max_staleness`` 0, where weights change only between steps; one that says nothing never does."""
    for e in engines:
        source = getattr(e, "version_source", None)
        if source is None:
            raise StalenessError(
                f"engine {e.name} does not say which policy version sampled its tokens, so none of them "
                "can be trained on: use rstar2 serve, rstar2 vllm, or a server with SGLang's /get_weight_version"
            )
        if source == "stated" and max_staleness > 0:
            raise StalenessError(
                f"engine {e.name} states only the version it holds, not each token's: with "
                f"asynchronous.max_staleness={max_staleness} weights change while it samples; use "
                "max_staleness 0, or rstar2 serve / rstar2 vllm, whose tokens carry their versions"
            )


def check_versions(trajectories: Sequence[Any], *, trained_by: int, max_staleness: int) -> None:
    """Before an update from policy ``trained_by``: a ``StalenessError`` naming the engine of the
    first model token not sampled by a version in [trained_by - max_staleness, trained_by], or
    whose version its engine did not report (-1)."""
    low = trained_by - max_staleness
    for t in trajectories:
        at = 0
        for turn in t.turns:
            for v in t.versions[at : at + turn.model_tokens]:
                if not low <= v <= trained_by:
                    why = (
                        "its engine did not report it"
                        if v < 0
                        else "it holds other weights than the trainer sent"
                        if v > trained_by
                        else "older than the bound lets a group start with"
                    )
                    raise StalenessError(
                        f"engine {turn.engine or '?'} sampled a token with policy version {v}, outside "
                        f"[{low}, {trained_by}] (the trainer is at version {trained_by}, "
                        f"asynchronous.max_staleness={max_staleness}): {why}; the step was not trained"
                    )
            at += turn.model_tokens + turn.tool_tokens


def staleness_metrics(versions: Sequence[Sequence[int]], trained_by: int) -> dict[str, float]:
    """Per trained trajectory, the versions that sampled its model tokens (-1: a tool token);
    ``trained_by``: the version the update starts from. The mean and largest lag over tokens, and
    the share of trajectories whose tokens span two or more versions."""
    lags = [trained_by - v for vs in versions for v in vs if v >= 0]
    spans = [len({v for v in vs if v >= 0}) > 1 for vs in versions]
    return {
        "staleness/mean": statistics.fmean(lags) if lags else 0.0,
        "staleness/max": float(max(lags, default=0)),
        "staleness/multi_version_share": statistics.fmean(spans) if spans else 0.0,
    }


class GroupFeed:
    """Starts groups as the bound allows (none past ``last_step``, the run's last) and hands each
    step its own groups once they have all finished. ``launch(i)`` is called when group ``i`` is
    admitted (in order: it may take its problem from the data stream there) and returns what to
    await for its rollouts."""

    def __init__(
        self,
        launch: Callable[[int], Awaitable[Any]],
        *,
        first_step: int,
        last_step: int,
        batch_size: int,
        max_staleness: int,
    ) -> None:
        self.launch, self.batch_size, self.max_staleness = launch, batch_size, max_staleness
        self.next = first_step * batch_size  # the next group to start
        self.end = last_step * batch_size  # no group past the run's last step starts
        self.running: dict[int, asyncio.Task] = {}

    def advance(self, version: int) -> None:
        """The policy is now at ``version``: start every group the bound lets in."""
        while self.next < self.end and admissible(
            self.next, version=version, batch_size=self.batch_size, max_staleness=self.max_staleness
        ):
            self.running[self.next] = asyncio.ensure_future(self.launch(self.next))
            self.next += 1

    async def step(self, step: int) -> list[Any]:
        """The groups of ``step`` (0-based: the policy has had ``step`` updates, its version), each
        the result of its ``launch``; first starts every group that version lets in."""
        self.advance(step)
        groups = range(step * self.batch_size, (step + 1) * self.batch_size)
        return list(await asyncio.gather(*(self.running.pop(i) for i in groups)))

    async def close(self) -> None:
        """Cancel the groups started for steps that will not run (a resumed run redoes them)."""
        for task in self.running.values():
            task.cancel()
        await asyncio.gather(*self.running.values(), return_exceptions=True)
        self.running.clear()

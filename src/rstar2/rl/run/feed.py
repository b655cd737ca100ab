"""The feed of rollout groups: each started as soon as the staleness bound admits it, so that at
k > 0 later steps' groups sample while the trainer updates."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ..algorithm.staleness import admissible


class GroupFeed:
    """Starts groups as the bound allows (none past ``last_step``), each with ``launch(i)`` (in order),
    and hands each step its own once all have finished."""

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
        """The groups of ``step`` (0-based: the policy's version), after starting all it lets in."""
        self.advance(step)
        groups = range(step * self.batch_size, (step + 1) * self.batch_size)
        return list(await asyncio.gather(*(self.running.pop(i) for i in groups)))

    async def close(self) -> None:
        """Cancel the groups started for steps that will not run (a resumed run redoes them)."""
        for task in self.running.values():
            task.cancel()
        await asyncio.gather(*self.running.values(), return_exceptions=True)
        self.running.clear()

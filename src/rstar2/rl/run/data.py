"""Training data order: shuffled per epoch from (seed, epoch), so a checkpointed position (one
integer) is enough to continue a run exactly where it stopped."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any


class DataStream:
    """Rows (problems, or SFT examples) in a shuffled order per epoch."""

    def __init__(self, rows: Sequence[Any], seed: int, shuffle: bool, position: int = 0):
        if not rows:
            raise ValueError("the training set is empty")
        self.rows, self.seed, self.shuffle, self.position = list(rows), seed, shuffle, position
        self._epoch, self._order = -1, []  # the order of the epoch the position is in

    def take(self, n: int) -> list[Any]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.rows))
            if epoch != self._epoch:
                self._epoch, self._order = epoch, list(range(len(self.rows)))
                if self.shuffle:
                    random.Random(self.seed * 7919 + epoch).shuffle(self._order)
            out.append(self.rows[self._order[i]])
            self.position += 1
        return out

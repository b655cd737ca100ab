"""The worker's requests, read ahead while a call runs (``WorkerHandle.depth``), and handed back when
that call runs long: past ``HAND_BACK_S``, a queued call (not a session's: its state lives here) goes
back unstarted and the pool gives it to another worker.
"""

from __future__ import annotations

from collections import deque

from .framing import recv_msg, send_msg


class Inbox:
    HAND_BACK_S = 0.05

    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd, self.wfd = rfd, wfd
        self.backlog: deque[dict | None] = deque()  # None: the handle closed the pipe

    def next(self) -> dict | None:
        return self.backlog.popleft() if self.backlog else recv_msg(self.rfd)

    @property
    def open(self) -> bool:
        return not self.backlog or self.backlog[-1] is not None

    def read_one(self) -> None:
        self.backlog.append(recv_msg(self.rfd))

    @staticmethod
    def _returnable(msg: dict | None) -> bool:
        return msg is not None and msg.get("op") == "run" and not msg.get("session_id")

    def can_hand_back(self) -> bool:
        return any(self._returnable(m) for m in self.backlog)

    def hand_back(self) -> None:
        for msg in self.backlog:
            if self._returnable(msg):
                send_msg(self.wfd, {"op": "returned", "id": msg["id"]})
        self.backlog = deque(m for m in self.backlog if not self._returnable(m))

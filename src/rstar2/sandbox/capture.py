"""Bounded capture of what a call prints: each stream keeps its head and tail and counts what was cut
in the middle; a call's streams together are held to the output limit."""

from __future__ import annotations

import json
import os

from .request import Limits


class Capture:
    def __init__(self, limit: int) -> None:
        self.limit = max(16, limit)
        self.half = self.limit // 2
        self.head, self.tail = bytearray(), bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.half:  # trim rarely, not on every chunk
                del self.tail[: len(self.tail) - self.half]

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    def text(self) -> str:
        if not self.truncated:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "backslashreplace")
        tail = bytes(self.tail[-self.half :])
        cut = self.total - len(self.head) - len(tail)
        return (
            bytes(self.head).decode("utf-8", "backslashreplace")
            + f"\n...[{cut} bytes cut]...\n"
            + tail.decode("utf-8", "backslashreplace")
        )


def cut_middle(text: str, limit: int) -> tuple[str, bool]:
    """Cut a string in the middle to at most about `limit` characters, with a visible marker."""
    if len(text) <= limit:
        return text, False
    half = max(1, limit // 2)
    return text[:half] + f"\n...[{len(text) - 2 * half} characters cut]...\n" + text[-half:], True


class CallOutput:
    """A call's three streams (stdout, stderr, and the child's report on its own pipe), each captured
    within its bounds, and the total it printed, checked against ``max_output_mb``. Each is a fresh
    pipe: this captures its reading end; ``writing_ends`` (stdout, stderr, report) are the child's."""

    REPORT_BYTES = 4 << 20

    def __init__(self, limits: Limits) -> None:
        (out_r, out_w), (err_r, err_w), (report_r, report_w) = os.pipe(), os.pipe(), os.pipe()
        self.writing_ends = [out_w, err_w, report_w]
        self.out, self.err = Capture(limits.output_bytes), Capture(limits.output_bytes)
        self.report_stream = Capture(self.REPORT_BYTES)
        self.streams = {out_r: self.out, err_r: self.err, report_r: self.report_stream}
        self.hard_limit = int(limits.max_output_mb * 1024 * 1024)

    def read(self, fd: int) -> bool:
        """Take what is waiting on `fd`; False at its end."""
        chunk = os.read(fd, 1 << 16)
        if chunk:
            self.streams[fd].feed(chunk)
        return bool(chunk)

    @property
    def over_limit(self) -> bool:
        return self.out.total + self.err.total > self.hard_limit

    def report(self) -> dict:
        """The child's structured report (trailing value, exception type), {} when it wrote none."""
        if not self.report_stream.total:
            return {}
        try:
            return json.loads(bytes(self.report_stream.head) + bytes(self.report_stream.tail))
        except ValueError:
            return {}

    def close(self) -> None:
        for fd in self.streams:
            os.close(fd)

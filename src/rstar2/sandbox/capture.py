"""Bounded capture of a stream: keeps the head and the tail, counts what was cut in the middle."""

from __future__ import annotations


class Capture:
    def __init__(self, limit: int) -> None:
        self.limit = max(16, limit)
        self.half = self.limit // 2
        self.head = bytearray()
        self.tail = bytearray()
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

"""Messages between a ``WorkerHandle`` and its worker process: JSON objects, each preceded by its
length (4 bytes, network order), over the worker's stdin and stdout pipes. The worker reads and writes
blocking descriptors; the handle reads an asyncio stream (``read_msg`` only awaits the stream it is
given, so the worker never imports asyncio).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

HEADER = struct.Struct("!I")


def encode(obj: dict) -> bytes:
    data = json.dumps(obj).encode()
    return HEADER.pack(len(data)) + data


def send_msg(fd: int, obj: dict) -> None:
    view = memoryview(encode(obj))
    while view:
        view = view[os.write(fd, view) :]


def recv_msg(fd: int) -> dict | None:
    """The next message, or None when the other side closed the pipe."""
    header = _read_exact(fd, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    body = _read_exact(fd, size)
    return None if body is None else json.loads(body)


async def read_msg(stream: Any) -> dict:
    """The next message from an ``asyncio.StreamReader``; ``IncompleteReadError`` when it closed."""
    (size,) = HEADER.unpack(await stream.readexactly(HEADER.size))
    return json.loads(await stream.readexactly(size))


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = os.read(fd, size - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)

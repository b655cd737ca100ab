"""The worker's parts one by one, without a worker: framing, the inbox's hand-back, the output
limit, and the mapping from how a child ended to a status (checked against hand-made endings)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from rstar2.sandbox.capture import CallOutput
from rstar2.sandbox.framing import encode, read_msg, recv_msg, send_msg
from rstar2.sandbox.inbox import Inbox
from rstar2.sandbox.outcome import INTERNAL_EXIT, to_result
from rstar2.sandbox.request import Limits


def exited(code: int) -> int:
    return (code & 0xFF) << 8  # a wait status as os.waitpid returns it


def output(limits: Limits, out: bytes = b"", err: bytes = b"", report: bytes = b"") -> CallOutput:
    cap = CallOutput(limits)
    for w, data in zip(cap.writing_ends, (out, err, report), strict=True):
        os.write(w, data)
        os.close(w)
    for r in cap.streams:
        while cap.read(r):
            pass
    cap.close()
    return cap


def test_messages_survive_the_pipe_both_ways():
    r, w = os.pipe()
    msgs = [{"op": "run", "id": 1, "code": "print('é' * 3)"}, {"op": "exit"}, {"x": "y" * 100_000}]
    for m in msgs[:2]:
        send_msg(w, m)
    assert [recv_msg(r), recv_msg(r)] == msgs[:2]

    async def read_async():
        reader = asyncio.StreamReader()
        reader.feed_data(encode(msgs[2]))
        reader.feed_eof()
        got = await read_msg(reader)
        with pytest.raises(asyncio.IncompleteReadError):
            await read_msg(reader)
        return got

    assert asyncio.run(read_async()) == msgs[2]
    os.close(w)
    assert recv_msg(r) is None  # the other side closed: None, not an exception
    os.close(r)


def test_the_inbox_hands_back_queued_calls_but_never_a_session_cell():
    to_worker_r, to_worker_w = os.pipe()
    to_handle_r, to_handle_w = os.pipe()
    inbox = Inbox(to_worker_r, to_handle_w)
    send_msg(to_worker_w, {"op": "run", "id": 7, "code": "1"})
    send_msg(to_worker_w, {"op": "run", "id": 8, "code": "1", "session_id": "s"})
    inbox.read_one()
    inbox.read_one()
    assert inbox.can_hand_back()
    inbox.hand_back()
    assert recv_msg(to_handle_r) == {"op": "returned", "id": 7}
    assert not inbox.can_hand_back() and inbox.next()["id"] == 8  # the session's cell stays here
    os.close(to_worker_w)
    inbox.read_one()
    assert not inbox.open and inbox.next() is None
    for fd in (to_worker_r, to_handle_r, to_handle_w):
        os.close(fd)


def test_output_limit_counts_stdout_and_stderr_together():
    limits = Limits(output_bytes=64, max_output_mb=100 / (1024 * 1024))  # 100 bytes in all
    assert not output(limits, out=b"a" * 50, err=b"b" * 50).over_limit
    cap = output(limits, out=b"a" * 60, err=b"b" * 60)
    assert cap.over_limit
    assert cap.out.total == 60 and cap.out.text() == "a" * 60  # within output_bytes: kept whole
    assert output(limits, report=b"not json").report() == {}


@pytest.mark.parametrize(
    ("wstatus", "killed", "oom", "report", "status", "reason"),
    [
        (exited(0), None, False, b"", "ok", None),
        (exited(1), None, False, b'{"error_type": "ZeroDivisionError"}', "error", "ZeroDivisionError"),
        (exited(3), None, False, b"", "error", "exit code 3"),
        (signal.SIGKILL, "timeout", False, b"", "timeout", "wall-clock limit of 2 s exceeded"),
        (signal.SIGKILL, "output_limit", False, b"", "output_limit", "printed more than 8 MB; stopped"),
        (signal.SIGKILL, None, True, b"", "memory", "memory limit of 256 MB exceeded"),
        (
            exited(1),
            None,
            False,
            b'{"error_type": "MemoryError"}',
            "memory",
            "memory limit of 256 MB exceeded",
        ),
        (signal.SIGXCPU, None, False, b"", "timeout", "CPU limit of 3 s exceeded"),
        (signal.SIGSEGV, None, False, b"", "error", "killed by SIGSEGV"),
        (exited(INTERNAL_EXIT), None, False, b"", "internal", "the worker child failed"),
        (exited(INTERNAL_EXIT), None, False, b'{"internal": "no /tmp"}', "internal", "no /tmp"),
        (None, None, False, b"", "ok", None),  # how it ended is unknown: the caller decides
    ],
)
def test_how_a_child_ended_becomes_a_status(wstatus, killed, oom, report, status, reason):
    limits = Limits(timeout_s=2, memory_mb=256)
    result = to_result(limits, 0.5, output(limits, report=report), wstatus, killed, oom, 0.25)
    assert (result.status, result.reason) == (status, reason)
    assert result.duration_s == 0.5 and result.cpu_s == 0.25
    if killed:
        assert result.signal is None  # our own kill is not the code's signal


def test_a_trailing_value_shows_only_when_nothing_was_printed_and_is_cut_to_the_limit():
    limits = Limits(output_bytes=40)
    shown = to_result(
        limits, 0, output(limits, report=b'{"value": "' + b"7" * 100 + b'"}'), exited(0), None, False, None
    )
    assert shown.value is not None and "characters cut" in shown.value and shown.truncated
    printed = to_result(
        limits, 0, output(limits, out=b"hi\n", report=b'{"value": "7"}'), exited(0), None, False, None
    )
    assert printed.value is None and printed.stdout == "hi\n"

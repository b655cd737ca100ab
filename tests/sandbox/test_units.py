"""Pure helpers: output capture, trailing-expression split, traceback cleaning, limits."""

from __future__ import annotations

from rstar2.sandbox.capture import Capture, cut_middle
from rstar2.sandbox.result import ExecResult, Limits
from rstar2.sandbox.runner import split_trailing_expression


def test_capture_keeps_head_and_tail():
    c = Capture(20)
    for chunk in (b"0123456789", b"abcdefghij", b"KLMNOPQRST", b"uvwxyz"):
        c.feed(chunk)
    assert c.total == 36 and c.truncated
    text = c.text()
    assert text.startswith("0123456789") and text.endswith("QRSTuvwxyz") and "[16 bytes cut]" in text


def test_capture_small_output_untouched():
    c = Capture(100)
    c.feed(b"hello ")
    c.feed(b"\xffworld")
    assert not c.truncated and c.text() == "hello \\xffworld"


def test_cut_middle():
    assert cut_middle("short", 10) == ("short", False)
    text, cut = cut_middle("a" * 10 + "b" * 10, 10)
    assert cut and text.startswith("aaaaa") and text.endswith("bbbbb") and "10 characters cut" in text


def test_split_trailing_expression():
    body, last = split_trailing_expression("x = 1\nx + 1")
    assert len(body.body) == 1 and last is not None
    body, last = split_trailing_expression("x = 1\nprint(x)\n")
    assert last is not None  # a call is an expression too (its value None is not shown)
    body, last = split_trailing_expression("for i in range(3):\n    i")
    assert last is None


def test_limits_merge_and_roundtrip():
    limits = Limits().merged(timeout_s=3, memory_mb=512)
    assert limits.timeout_s == 3.0 and limits.memory_mb == 512 and limits.effective_cpu_s() == 4
    assert Limits.from_dict(limits.to_dict()) == limits
    r = ExecResult("ok", stdout="1")
    assert ExecResult.from_dict(r.to_dict()) == r and r.output == "1"

"""Pure helpers: output capture, trailing-expression split, traceback cleaning, limits."""

from __future__ import annotations

from rstar2.sandbox.capture import Capture, cut_middle
from rstar2.sandbox.interpreter import split_trailing_expression
from rstar2.sandbox.request import Limits
from rstar2.sandbox.result import ExecResult


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


def test_imported_modules_scan():
    from rstar2.sandbox.routing import imported_modules

    code = (
        "import math, os.path as p\nfrom fractions import Fraction\n"
        "if x: import numpy as np\ny = 1; import sympy\n# import scipy\ns = 'import torch'\n"
        "from . import sibling\n"
    )
    assert imported_modules(code) == {"math", "os", "fractions", "numpy", "sympy", ""}
    assert imported_modules("print(1+1)") == set()
    assert imported_modules("m = __import__('numpy')") is None
    assert imported_modules("import importlib\nimportlib.import_module('x')") is None


def test_a_call_goes_to_the_light_zygote_only_if_it_imports_nothing_new():
    from rstar2.sandbox.routing import fits_light, split_preload

    light, full = split_preload(["math", "fractions", "numpy", "sympy", "rstar2.reward.equivalence"])
    assert light == ["math", "fractions"] and full[-1] == "rstar2.reward.equivalence"
    assert split_preload(["math", "json"]) == (["math", "json"], ["math", "json"])  # one zygote suffices
    have = frozenset({"math", "fractions", "sys", "os"})
    assert fits_light("from math import gcd\nprint(gcd(4, 6))", have)
    assert fits_light("x = 2 ** 10", have)
    assert not fits_light("import sympy\nprint(sympy.pi)", have)
    assert not fits_light("import math\nimport statistics", have)  # not imported there yet
    assert not fits_light("__import__('os')", have)  # dynamic: the full zygote

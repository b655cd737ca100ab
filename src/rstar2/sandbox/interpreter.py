"""Runs model-written code inside the already-isolated child: notebook-style value, clean tracebacks.
The structured outcome (value, exception type) goes to a dedicated result pipe, never through the
code's own stdout, so nothing the code prints can be mistaken for control data."""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import json
import linecache
import os
import sys
import traceback

FILENAME = "<code>"
TRACEBACK_FRAMES = 8  # the last frames of a traceback that are shown


def split_trailing_expression(code: str) -> tuple[ast.Module, ast.Expression | None]:
    """Split `code` into a body and its final bare expression, if any (what a notebook displays)."""
    tree = ast.parse(code, FILENAME, "exec")
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop()
        return tree, ast.Expression(last.value)
    return tree, None


def format_exception(exc: BaseException) -> str:
    """The traceback as Python prints it, without the interpreter's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != FILENAME:
        tb = tb.tb_next
    te = traceback.TracebackException(type(exc), exc, tb, limit=-TRACEBACK_FRAMES if tb else 0)
    return "".join(te.format())


def fresh_stdio() -> None:
    """New text streams over fds 0-2. A zygote makes them once, after its imports and before its
    first fork, so a call's child starts with clean, unused streams without building any."""
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace")
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=False
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _exit_code(exc: SystemExit) -> int:
    """What `sys.exit(arg)` ends the process with, as Python does (a message is printed: 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def run_code(code: str, result_fd: int, namespace: dict | None = None, new_stdio: bool = True) -> int:
    """Execute `code` (in `namespace`, or a fresh `__main__`) and report on `result_fd`; returns the
    exit code the process should end with. Called in a forked child only; `new_stdio=False` when the
    streams the child inherited are unused (see `fresh_stdio`)."""
    if new_stdio:
        fresh_stdio()
    report: dict = {}
    exit_code = 0
    if namespace is None:
        namespace = {"__name__": "__main__", "__builtins__": builtins}
    linecache.cache[FILENAME] = (len(code), None, code.splitlines(True), FILENAME)
    try:
        body, last = split_trailing_expression(code)
        exec(compile(body, FILENAME, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, FILENAME, "eval"), namespace)
            if value is not None:
                namespace["_"] = value
                report["value"] = repr(value)
    except SystemExit as exc:
        exit_code = _exit_code(exc)
        if exit_code:
            report["error_type"] = "SystemExit"
    except BaseException as exc:  # noqa: BLE001 - everything the code raises is its result
        report["error_type"] = type(exc).__name__
        try:
            sys.stderr.write(format_exception(exc))
        except Exception:
            sys.stderr.write(f"{type(exc).__name__}\n")
        exit_code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if "value" in report and len(report["value"]) > 1 << 20:
        report["value"] = report["value"][: 1 << 19] + "..." + report["value"][-(1 << 19) :]
    if report:  # nothing to say is the common case: an empty result pipe reads as {}
        with contextlib.suppress(OSError):
            os.write(result_fd, json.dumps(report).encode())
    return exit_code

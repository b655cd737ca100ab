"""Refuse answers that would make a CAS work for minutes (``9^9^9^9``, ``100000!``, 1,000 nested
brackets, a megabyte of digits), before any sympy call: none is a plausible competition answer."""

from __future__ import annotations

import math
import re

from .macros import unreadable
from .normalize import MAX_DIGITS

# what a checker at its memory cap answers before it is replaced (here: the pool never imports checker.py)
MEMORY_CAP_REASON = "memory cap reached"

MAX_CHARS = 2000
MAX_DEPTH = 40
MAX_RESULT_DIGITS = 10_000  # estimated digits of a power or factorial
MAX_FACTORIAL = 2000

_HEDGE = re.compile(r"\\approx|\\sim\b|\\simeq|≈|\?")
_POWER = re.compile(r"(\d+(?:\.\d+)?)\s*(?:\^|\*\*)\s*\{?\s*(\d+)\s*\}?")
_FACTORIAL = re.compile(r"(\d+)\s*!")
_TOWER = re.compile(r"\d\s*(?:\^|\*\*)\s*[{(]?\s*\d+\s*(?:\^|\*\*)")  # 9^9^9, 9^{9^{9}}


def nesting_depth(s: str) -> int:
    depth = best = 0
    for c in s:
        if c in "{([":
            depth += 1
            best = max(best, depth)
        elif c in "})]":
            depth = max(0, depth - 1)
    return best


# words that may stand in an answer's mathematics (sets, functions); any other word is prose
_MATH_WORDS = frozenset(
    "and or sin cos tan cot sec csc log ln exp sqrt pi max min gcd lcm mod arcsin arccos arctan".split()
)
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_TEXT_GROUP = re.compile(
    r"\\(?:text|mbox|mathrm|textbf|operatorname)\s*\{[^{}]*\}"
    r"|\\(?:begin|end)\s*\{[A-Za-z*]*\}(?:\{[lcr|]*\})?"
)


def stray_words(answer: str) -> set[str]:
    """Words outside LaTeX commands and ``\\text{}`` that are not mathematics: "6 squared",
    "not 42", "either 42 or 43". A CAS reading them would skip the words and keep the number."""
    bare = _TEXT_GROUP.sub(" ", answer)
    return {w.lower() for w in _WORD.findall(bare)} - _MATH_WORDS


def refuse(answer: str) -> str | None:
    """Why this answer is not worth a CAS call, or None when it is safe to parse."""
    if _HEDGE.search(answer):
        return "a hedged answer (approximate, or a question)"
    if (why := unreadable(answer)) is not None:  # the CAS would drop it, and what it holds with it
        return why
    if len(answer) > MAX_CHARS:
        return f"answer longer than {MAX_CHARS} characters"
    if nesting_depth(answer) > MAX_DEPTH:
        return f"brackets nested deeper than {MAX_DEPTH}"
    if any(len(run) > MAX_DIGITS for run in re.findall(r"\d+", answer)):
        return f"a number with more than {MAX_DIGITS} digits"
    if _TOWER.search(answer):
        return "a tower of numeric powers"
    for base, exp in _POWER.findall(answer):
        b, e = float(base), int(exp) if len(exp) < 12 else 10**12
        if b > 1 and e * math.log10(b) > MAX_RESULT_DIGITS:
            return f"a power with more than {MAX_RESULT_DIGITS} digits"
    if any(len(n) > 6 or int(n) > MAX_FACTORIAL for n in _FACTORIAL.findall(answer)):
        return f"a factorial of more than {MAX_FACTORIAL}"
    return None

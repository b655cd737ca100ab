"""Answer strings to a canonical form, and the exact fast path for plain numbers.

Most RL rewards compare integers; those (and decimals, simple fractions, percentages,
scientific notation, thousands separators) are decided here exactly with ``Fraction``,
never by rounding, so ``0.333`` is not ``1/3`` and ``50`` is not ``0.5``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

MAX_DIGITS = 1000  # a literal longer than this is not a plausible answer (and slow to convert)

_SPACING = re.compile(r"(?<!\\)\\[,;:! ]|\\q?quad\b|~|\\displaystyle\b|\\left\b|\\right\b|\\middle\b")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree\b|\\text\{\s*degrees?\s*\}")
# units after a number: "5.4 \text{ cents}", "864 \mbox{ inches}^2", "15 cm"
_UNIT = re.compile(
    r"(?<=[\d}])\s*\\(?:text|mbox|mathrm)\{\s*[A-Za-z][A-Za-z .]*\}(?:\s*\^\s*\{?[23]\}?)?\s*$"
)
_ASSIGN = re.compile(r"^\s*[A-Za-z](?:_\{?\w+\}?)?\s*(?:=|\\in)\s*(?!.*=)")
_TEXT_WRAP = re.compile(r"^\\(?:text|textbf|mathrm|mbox|textit|mathbf)\{(.*)\}$", re.DOTALL)

_NUM = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PLAIN = re.compile(
    rf"^([+-]?)({_NUM})(?:[eE]([+-]?\d+)|\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{{?\s*([+-]?\d+)\s*\}}?)?$"
)
_THOUSANDS = re.compile(r"^([+-]?)(\d{1,3}(?:, ?\d{3})+)(\.\d+)?$")
_FRAC = re.compile(r"^([+-]?)\\frac\s*(?:\{\s*([+-]?\d+)\s*\}|(\d))\s*(?:\{\s*(\d+)\s*\}|(\d))$")
_SLASH = re.compile(r"^([+-]?)(\d+)\s*/\s*(\d+)$")
_MIXED = re.compile(r"^([+-]?)(\d+)\s*\\frac\s*\{?(\d+)\}?\s*\{?(\d+)\}?$")
_CHOICE = re.compile(r"^\(([A-Ea-e])\)$|^([A-E])$")


def strip_delimiters(s: str) -> str:
    s = s.strip()
    changed = True
    while changed:
        changed = False
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s, changed = s[len(left) : len(s) - len(right)].strip(), True
    return s


_UNICODE = {"−": "-", "–": "-", "π": "\\pi ", "×": "\\times ", "·": "\\cdot ", "∞": "\\infty ", "\u00a0": " "}
_UNICODE_RE = re.compile("|".join(map(re.escape, _UNICODE)))


def normalize(answer: str) -> str:
    """Cosmetic clean-up that never changes a value: delimiters, spacing macros, ``\\dfrac``,
    degree signs, trailing units and punctuation, dollar signs, ``x =`` / ``x \\in`` prefixes."""
    s = strip_delimiters(_UNICODE_RE.sub(lambda m: _UNICODE[m.group(0)], answer))
    s = _SPACING.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\$", "").replace("$", "")
    s = _DEGREES.sub("", s)
    s = _UNIT.sub("", s)
    s = s.strip().rstrip(".;").strip()
    if s.endswith(",") and not s.endswith("\\,"):
        s = s[:-1].rstrip()
    s = _ASSIGN.sub("", s) if "=" in s or "\\in" in s else s
    return s.strip()


def text_answer(s: str) -> str | None:
    """A word answer (``\\text{Evelyn}``, ``east``, ``(C)``) in comparable form, else None.

    These must be compared as strings: a CAS reads ``Evelyn`` as the product E·v·e·l·y·n,
    which equals ``Evenly``.
    """
    m = _TEXT_WRAP.match(s)
    inner = m.group(1).strip() if m else s
    choice = _CHOICE.match(inner)
    if choice:
        return (choice.group(1) or choice.group(2)).lower()
    words = r"[A-Za-z][A-Za-z\-']*(?: [A-Za-z][A-Za-z\-']*)*" if m else r"[A-Za-z]{3,}(?: [A-Za-z]{3,})*"
    if re.fullmatch(words, " ".join(inner.split())):
        return " ".join(inner.lower().split())
    return None


@dataclass(frozen=True)
class PlainNumber:
    value: Fraction
    percent: bool  # written with a % sign: value is the number before the sign


def plain_number(s: str) -> PlainNumber | None:
    """Parse integers, decimals, ``a/b``, ``\\frac{a}{b}``, mixed numbers, ``1.5e3``,
    ``1.5\\times10^{3}``, ``10,080`` and a trailing ``%``; None for anything else."""
    s = s.strip()
    percent = False
    if s.endswith("\\%") or s.endswith("%"):
        percent, s = True, s[: -2 if s.endswith("\\%") else -1].strip()
    if len(s) > MAX_DIGITS + 20:
        return None
    value = _parse_value(s)
    return None if value is None else PlainNumber(value, percent)


def _parse_value(s: str) -> Fraction | None:
    m = _PLAIN.match(s)
    if m:
        sign, digits, exp1, exp2 = m.groups()
        exp = exp1 if exp1 is not None else exp2
        if exp is not None and abs(int(exp)) > MAX_DIGITS:
            return None
        v = Fraction(digits)
        if exp is not None:
            v *= Fraction(10) ** int(exp)
        return -v if sign == "-" else v
    m = _THOUSANDS.match(s)
    if m:
        sign, whole, frac = m.groups()
        v = Fraction(whole.replace(",", "").replace(" ", "") + (frac or ""))
        return -v if sign == "-" else v
    m = _FRAC.match(s)
    if m:
        sign, n1, n2, d1, d2 = m.groups()
        den = int(d1 or d2)
        if den == 0:
            return None
        v = Fraction(int(n1 or n2), den)
        return -v if sign == "-" else v
    m = _SLASH.match(s)
    if m:
        sign, n, d = m.groups()
        if int(d) == 0:
            return None
        v = Fraction(int(n), int(d))
        return -v if sign == "-" else v
    m = _MIXED.match(s)
    if m:
        sign, whole, n, d = m.groups()
        if int(d) == 0 or int(n) >= int(d):
            return None
        v = int(whole) + Fraction(int(n), int(d))
        return -v if sign == "-" else v
    return None


def same_plain_number(reference: PlainNumber, answer: PlainNumber) -> bool:
    """Exact equality; a % sign on one side is read both as a unit decoration (``50%`` vs ``50``)
    and as /100 (``50%`` vs ``0.5``). Nothing else: ``50`` vs ``0.5`` is wrong."""
    ref = reference.value / 100 if reference.percent else reference.value
    ans = answer.value / 100 if answer.percent else answer.value
    if ref == ans:
        return True
    return reference.percent != answer.percent and reference.value == answer.value


def has_decimal_literal(s: str) -> bool:
    return re.search(r"(?<![\w.])\d*\.\d+", s) is not None


def rationalize_decimals(s: str) -> str:
    """``3.14`` → ``\\frac{314}{100}``, so a CAS compares exactly instead of rounding."""

    def repl(m: re.Match) -> str:
        whole, frac = m.group(1) or "0", m.group(2)
        fraction = f"\\frac{{{int(whole + frac)}}}{{{10 ** len(frac)}}}"
        before = s[: m.start()].rstrip()
        # after ^ or _ a group needs braces; elsewhere braces would read as a set literal
        return f"{{{fraction}}}" if before.endswith(("^", "_")) else fraction

    return re.sub(r"(?<![\w.])(\d*)\.(\d+)(?![\d.])", repl, s)

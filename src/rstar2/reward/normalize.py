"""Answer strings to a canonical form, and the exact fast path for plain numbers: decided with
``Fraction``, never by rounding, so ``0.333`` is not ``1/3`` and ``50`` is not ``0.5``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from . import macros

MAX_DIGITS = 1000  # a literal longer than this is not a plausible answer (and slow to convert)

_SPACING = re.compile(r"(?<!\\)\\[,;:! ]|\\q?quad\b|~|\\displaystyle\b|\\left\b|\\right\b|\\middle\b")
_DEGREES = re.compile(
    r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree\b|\\(?:text|textnormal|mbox|mathrm)\{\s*degrees?\s*\}"
)
_PERCENT_TEXT = re.compile(r"\\(?:text|textnormal|mbox|mathrm)\{\s*(?:percent|per cent|pct)\s*\}")
# plain-word units after a number: "18 centimeters", "36 cm^2", "12 km/h", "1,234,567 people"
# (two letters at least, so "4 i" keeps its imaginary unit; stripped only when a plain number is left)
# (one-letter units only where they are SI symbols after a space: "12,000 m", "5 g", "30 s")
_WORD_UNIT = re.compile(
    r"(?<=[\d}])\s*(?:[A-Za-z]{2,}[A-Za-z/.]*|(?<=\s)[mgsL](?:/[a-z]+)?)"
    r"(?:\s+[A-Za-z]{2,}[A-Za-z/.]*)*(?:\^\{?[23]\}?)?$"
)
# number words that scale the value ("1.5 million"): applied, never stripped as a unit
_SCALES = dict(hundred=100, thousand=1000, million=10**6, billion=10**9, trillion=10**12, dozen=12)
_SCALE_WORD = re.compile(r"(?<=\d)\s+(" + "|".join(_SCALES) + r")\b", re.IGNORECASE)
# words that make a number something else ("6 squared", "5 factorial"): never stripped as a unit
_NOT_UNITS = frozenset("squared cubed factorial times plus minus over divided and or to of by".split())
_PERCENT_WORD = re.compile(r"(?<=\d)\s*(?:percent|per cent|pct)\.?$", re.IGNORECASE)
ASSIGNMENT = re.compile(r"^\s*[A-Za-z](?:_\{?\w+\}?)?\s*(?:=|\\in)\s*(?!.*=)")
_TEXT_WRAP = re.compile(r"^\\(?:text|textbf|mathrm|mbox|textit|mathbf)\{(.*)\}$", re.DOTALL)

_NUM = r"(?:\d+(?:\.\d*)?|\.\d+)"
# unsigned forms (``plain_number`` takes the sign off first)
_PLAIN = re.compile(
    rf"^({_NUM})(?:[eE]([+-]?\d+)|\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{{?\s*([+-]?\d+)\s*\}}?)?$"
)
_THOUSANDS = re.compile(r"^(\d{1,3}(?:(?:, ?| )\d{3})+)(\.\d+)?$")
_FRAC = re.compile(r"^\\frac\s*(?:\{\s*([+-]?\d+)\s*\}|(\d))\s*(?:\{\s*(\d+)\s*\}|(\d))$")
_SLASH = re.compile(r"^(\d+)\s*/\s*(\d+)$")
_MIXED = re.compile(r"^(\d+)\s*\\frac\s*\{?(\d+)\}?\s*\{?(\d+)\}?$")
_DECIMAL_LITERAL = re.compile(r"^[+-]?(\d*)\.(\d+)$")
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


_POWER_OP = re.compile(r"(?<=[\w)}\]])\s*\*\*\s*(?=[\w({\-])")
_PLAIN_FUNCTION = re.compile(r"(?<![\\A-Za-z])(sin|cos|tan|cot|sec|csc|log|ln|exp)(?=\s*\()")
_RELATIONS = [
    (re.compile(r"\\geqslant|\\geq|\\ge(?![A-Za-z])|>=|≥"), r"\\geq "),
    (re.compile(r"\\leqslant|\\leq|\\le(?![A-Za-z])|<=|≤"), r"\\leq "),
    (re.compile(r"\\neq|\\ne(?![A-Za-z])|!=|≠"), r"\\neq "),
    (re.compile(r"\\lt(?![A-Za-z])"), "<"),
    (re.compile(r"\\gt(?![A-Za-z])"), ">"),
]
_UNICODE = str.maketrans(
    {"−": "-", "–": "-", "π": "\\pi ", "×": "\\times ", "·": "\\cdot ", "∞": "\\infty ", "\u00a0": " "}
)

_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_NUMBER_WORDS = {w: n for n, w in enumerate(_ONES)} | {w: 20 + 10 * i for i, w in enumerate(_TENS)}


def number_word(s: str) -> int | None:
    """``four`` → 4, ``twenty-one`` → 21 (0 to 99): a count written in words."""
    words = re.split(r"[\s-]+", s.strip().lower())
    if not 1 <= len(words) <= 2 or any(w not in _NUMBER_WORDS for w in words):
        return None
    if len(words) == 2 and not (words[0] in _TENS and 0 < _NUMBER_WORDS[words[1]] < 10):
        return None
    return sum(_NUMBER_WORDS[w] for w in words)


def normalize(answer: str, keep_assignment: bool = False) -> str:
    """Cosmetic clean-up that never changes a value (text macros by ``macros.resolve``'s rule); the
    ``x =`` / ``x \\in`` / ``5 = x`` of an assignment is kept only with ``keep_assignment``."""
    s = strip_delimiters(answer.translate(_UNICODE))
    s = _SPACING.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\$", "").replace("$", "")
    s = _POWER_OP.sub("^", s)  # Python's x**2
    s = _PLAIN_FUNCTION.sub(r"\\\1", s)  # sin(x) -> \sin(x)
    s = s.replace("{,}", ",").replace("\\varnothing", "\\emptyset").replace("\\{\\}", "\\emptyset")
    if (counted := number_word(_TEXT_WRAP.sub(r"\1", s))) is not None:
        s = str(counted)
    for pattern, canonical in _RELATIONS:  # one spelling per relation: >=, \ge, ≥ are \geq
        s = pattern.sub(canonical, s)
    s = _DEGREES.sub("", s)
    s = macros.resolve(_PERCENT_TEXT.sub("%", s))  # text macros: symbols, separators, units at the end
    s = _PERCENT_WORD.sub("%", s)
    s = _apply_scale(s)
    if (unit := _WORD_UNIT.search(s)) and plain_number(s[: unit.start()]) is not None:
        words = {w.lower() for w in re.findall(r"[A-Za-z]+", unit.group(0))}
        if not words & _NOT_UNITS:
            s = s[: unit.start()]
    s = s.strip().rstrip(".;").strip()
    if s.endswith(",") and not s.endswith("\\,"):
        s = s[:-1].rstrip()
    return s if keep_assignment else drop_assignment(s)


_REVERSED_ASSIGNMENT = re.compile(r"^([^=]+?)\s*=\s*[A-Za-z](?:_\{?\w+\}?)?\s*$")


def drop_assignment(s: str) -> str:
    """``x = 5`` → ``5``, ``x \\in [0, 1]`` → ``[0, 1]`` (one left side only: ``a = b = c`` stays),
    and ``5 = x`` → ``5`` (a value on the left: no letters outside macros)."""
    if "=" not in s and "\\in" not in s:
        return s
    reversed_ = _REVERSED_ASSIGNMENT.match(s)
    if reversed_ and not re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", reversed_.group(1))):
        return reversed_.group(1).strip()
    return ASSIGNMENT.sub("", s).strip()


def _apply_scale(s: str) -> str:
    """``1.5 million dollars`` → ``1500000 dollars``: only when a plain number precedes the word."""
    if (m := _SCALE_WORD.search(s)) is None:
        return s
    number = plain_number(s[: m.start()])
    if number is None or number.percent:
        return s
    value = number.value * _SCALES[m.group(1).lower()]
    text = str(value.numerator) if value.denominator == 1 else str(float(value))
    return text + s[m.end() :]


def text_answer(s: str) -> str | None:
    """A word answer (``\\text{Evelyn}``, ``east``, ``(C)``) in comparable form, else None: compared
    as strings, since a CAS reads ``Evelyn`` as the product E·v·e·l·y·n, which equals ``Evenly``."""
    m = _TEXT_WRAP.match(s)
    inner = m.group(1).strip() if m else s
    if choice := _CHOICE.match(inner):
        return (choice.group(1) or choice.group(2)).lower()
    words = r"[A-Za-z][A-Za-z\-']*(?: [A-Za-z][A-Za-z\-']*)*" if m else r"[A-Za-z]{2,}(?: [A-Za-z]{2,})*"
    if re.fullmatch(words, " ".join(inner.split())):
        return " ".join(inner.lower().split())
    return None


@dataclass(frozen=True)
class PlainNumber:
    value: Fraction
    percent: bool  # written with a % sign: value is the number before the sign
    decimals: int | None = None  # digits after the point of a decimal literal (None: exact form)
    significant: int = 0  # significant digits of a decimal literal


def plain_number(s: str) -> PlainNumber | None:
    """Parse integers, decimals, ``a/b``, ``\\frac{a}{b}``, mixed numbers, ``1.5e3``,
    ``1.5\\times10^{3}``, ``10,080`` and a trailing ``%``; None for anything else."""
    s = s.strip()
    percent = False
    if s.endswith("\\%") or s.endswith("%"):
        percent, s = True, s[: -2 if s.endswith("\\%") else -1].strip()
    if len(s) > MAX_DIGITS + 20:
        return None
    if (value := _unsigned_value(s[1:] if s[:1] in ("+", "-") else s)) is None:
        return None
    value = -value if s[:1] == "-" else value
    if (literal := _DECIMAL_LITERAL.match(s)) is None:
        return PlainNumber(value, percent)
    digits = (literal.group(1) + literal.group(2)).lstrip("0")
    return PlainNumber(value, percent, len(literal.group(2)), len(digits))


_REPEATING = re.compile(r"^(\d*)\.(\d*)\\overline\s*\{(\d+)\}$")


def _unsigned_value(s: str) -> Fraction | None:
    if m := _REPEATING.match(s):  # 0.1\overline{6} = 1/6
        whole, fixed, period = m.groups()
        v = Fraction(int(whole or "0")) + Fraction(int(fixed or "0"), 10 ** len(fixed))
        return v + Fraction(int(period), (10 ** len(period) - 1) * 10 ** len(fixed))
    if m := _PLAIN.match(s):
        digits, exp1, exp2 = m.groups()
        exp = exp1 if exp1 is not None else exp2
        if exp is None:
            return Fraction(digits)
        return Fraction(digits) * Fraction(10) ** int(exp) if abs(int(exp)) <= MAX_DIGITS else None
    if m := _THOUSANDS.match(s):
        whole, frac = m.groups()
        return Fraction(whole.replace(",", "").replace(" ", "") + (frac or ""))
    if m := _FRAC.match(s):
        n1, n2, d1, d2 = m.groups()
        den = int(d1 or d2)
        return Fraction(int(n1 or n2), den) if den else None
    if m := _SLASH.match(s):
        n, d = (int(g) for g in m.groups())
        return Fraction(n, d) if d else None
    if m := _MIXED.match(s):
        whole, n, d = (int(g) for g in m.groups())
        return whole + Fraction(n, d) if n < d else None  # a proper fraction (so d > 0)
    return None


def same_plain_number(reference: PlainNumber, answer: PlainNumber) -> bool:
    """Exact equality; a % sign on one side is read both as a unit decoration (``50%`` vs ``50``)
    and as /100 (``50%`` vs ``0.5``). Nothing else: ``50`` vs ``0.5`` is wrong."""
    ref = reference.value / 100 if reference.percent else reference.value
    ans = answer.value / 100 if answer.percent else answer.value
    return ref == ans or (reference.percent != answer.percent and reference.value == answer.value)


FLOAT_PRINT_DIGITS = 15  # a decimal this long is a program's print of a value, not a rounding


def is_float_print(exact: PlainNumber, decimal: PlainNumber) -> bool:
    """``decimal`` is how a program prints the fraction ``exact`` (Python prints 1/12 as
    0.08333333333333333): 15 significant digits at least, and either the nearest double's shortest
    repr or the value correctly rounded to that many places. ``0.333`` is not 1/3."""
    if exact.decimals is not None or decimal.decimals is None or exact.percent != decimal.percent:
        return False
    if decimal.significant < FLOAT_PRINT_DIGITS or exact.value.denominator == 1:
        return False
    return float(exact.value) == float(decimal.value) or round(exact.value, decimal.decimals) == decimal.value


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

"""Answers with structure, brought to forms that compare: an equation against an equation, an
inequality against an interval, a chain ``a = b`` against its last side, lists of numbers as
multisets, matrices cell by cell. ``normalize`` (cosmetics) and ``plain_number`` (exact values)
are the pieces; ``normalize_pair`` decides how a reference and an answer meet."""

from __future__ import annotations

import re
from collections.abc import Iterator
from fractions import Fraction

from .normalize import ASSIGNMENT, drop_assignment, normalize, plain_number

_RELATION = re.compile(r"[=<>]|\\(?:geq|leq|neq|in)\b")
# between the items of a listed answer: "2, 3", "2; 3", "x = 2 or x = 3", "2 \\text{ and } 3"
_SEPARATORS = re.compile(r"\s*(?:,|;|\\text\{\s*(?:or|and)\s*\}|\b(?:or|and)\b)\s*")
_SET_BRACES = re.compile(r"^\\\{(.*)\\\}$", re.DOTALL)
_PLUS_MINUS = re.compile(r"^([+-]?[^\\]*?)\s*\\pm\s*(.+)$")
_THOUSANDS_COMMA = re.compile(r"(?<![\d.])\d{1,3},\d{3}(?!\d)|\d,\d{3}(?![\d.])")
_TUPLE = re.compile(r"^(?:\\left\s*)?\((.*?)(?:\\right\s*)?\)$", re.DOTALL)
_OP = r"(<|>|\\leq|\\geq)"
_CHAIN = re.compile(rf"^([^<>=\\]*?(?:\\[a-z]+[^<>=\\]*?)*)\s*{_OP}\s*([a-zA-Z])\s*{_OP}\s*(.+)$")
_ONE_SIDED = re.compile(rf"^([a-zA-Z])\s*{_OP}\s*(.+)$")
_ONE_SIDED_LEFT = re.compile(rf"^(.+?)\s*{_OP}\s*([a-zA-Z])$")
_TURNED = {"<": ">", ">": "<", "\\leq": "\\geq", "\\geq": "\\leq"}
_OR = re.compile(r"\s*(?:\\text\{\s*or\s*\}|\bor\b|\\cup|\\vee)\s*")
_INTERVALISH = re.compile(r"^[\[(].*,.*[\])](?:\s*\\cup\s*[\[(].*,.*[\])])*$")


def _assigned(s: str) -> str | None:
    m = ASSIGNMENT.match(s)
    return m.group(0).split("=")[0].split("\\in")[0].strip() if m else None


def _bound(op: str, low_side: bool) -> str:
    closed = op in ("\\leq", "\\geq")
    return ("[" if closed else "(") if low_side else ("]" if closed else ")")


def inequality_as_interval(s: str) -> str | None:
    """``0 < x \\leq 1`` → ``(0, 1]``; ``x < 2 or x > 3`` → ``(-\\infty, 2) \\cup (3, \\infty)``:
    the solution set of an inequality in one variable, written as an interval answer is.
    None when ``s`` is not such an inequality."""
    pieces, var = [], None
    for part in _OR.split(s.strip()):
        if chain := _CHAIN.match(part):
            a, op1, v, op2, b = (g.strip() for g in chain.groups())
            if (op1 in ("<", "\\leq")) != (op2 in ("<", "\\leq")):
                return None
            if op1 in (">", "\\geq"):  # b < x < a written downwards
                a, op1, b, op2 = b, op2, a, op1
            pieces.append(f"{_bound(op1, True)}{a}, {b}{_bound(op2, False)}")
        elif m := _ONE_SIDED.match(part) or _ONE_SIDED_LEFT.match(part):
            v, op, a = (g.strip() for g in m.groups())
            if m.re is _ONE_SIDED_LEFT:  # a < x is x > a
                v, op, a = a, _TURNED[op], v
            if op in ("<", "\\leq"):
                pieces.append(f"(-\\infty, {a}{_bound(op, False)}")
            else:
                pieces.append(f"{_bound(op, True)}{a}, \\infty)")
        else:
            return None
        bounds = pieces[-1][1:-1].split(", ")
        if (
            var not in (None, v)
            or any(re.fullmatch(r"[a-zA-Z]", b) for b in bounds)
            or re.search(r"[<>=]|\\leq|\\geq", pieces[-1])
        ):
            return None
        var = v
    return " \\cup ".join(pieces) if pieces else None


def normalize_pair(reference: str, answer: str) -> tuple[str, str]:
    """Both normalized; two equations keep their left sides unless both solve for the same
    variable (``y = 2x + 3`` against ``x = (y - 3)/2`` is a pair of equations, not of values)."""
    ref, ans = normalize(reference, keep_assignment=True), normalize(answer, keep_assignment=True)
    if "=" in ref and "=" in ans and _assigned(ref) != _assigned(ans):
        return ref, ans
    ref, ans = drop_assignment(ref), drop_assignment(ans)
    if _INTERVALISH.match(ref) and (interval := inequality_as_interval(ans)) is not None:
        return ref, interval
    if _INTERVALISH.match(ans) and (interval := inequality_as_interval(ref)) is not None:
        return interval, ans
    if "=" in ans and not _RELATION.search(ref) and not _SEPARATORS.search(ans):
        ans = last_side(ans)  # "\\sqrt{20} = 2\\sqrt{5}" states its last side
    point = _TUPLE.match(ref)
    if (
        point
        and ans[:1] not in "(["
        and len(top_level_items(ans)) == len(top_level_items(point.group(1))) > 1
    ):
        ans = f"({ans})"  # "3, \\frac{\\pi}{2}" for the point "(3, \\frac{\\pi}{2})"
    return ref, ans


def _outside_brackets(s: str) -> Iterator[tuple[int, str]]:
    """Each character of ``s`` outside any bracket (an unmatched closing one is ignored)."""
    depth = 0
    for i, c in enumerate(s):
        if c in "{([":
            depth += 1
        elif c in "})]":
            depth = max(0, depth - 1)
        elif depth == 0:
            yield i, c


def top_level_items(s: str) -> list[str]:
    """The items of ``s`` split at commas and semicolons outside brackets (``(1,2), 3`` → two);
    a thousands separator (``10,455``) splits nothing."""
    items, start = [], 0
    for i, c in _outside_brackets(s):
        if c in ",;" and not _THOUSANDS_COMMA.match(s, i - 1):
            items.append(s[start:i].strip())
            start = i + 1
    items.append(s[start:].strip())
    return [item for item in items if item]


def last_side(s: str) -> str:
    """What follows the last ``=`` outside brackets (``\\sum_{k=1}^n k`` has none)."""
    cut = max((i for i, c in _outside_brackets(s) if c == "="), default=-1)
    return s[cut + 1 :].strip() if cut >= 0 and s[cut + 1 :].strip() else s


def listed_numbers(s: str) -> list[Fraction] | None:
    """The values of an answer that lists plain numbers ("2, 3", "x = 3 or x = 2", "\\{2, 3\\}",
    "\\pm 4", "1 \\pm 0.5"), sorted; None when ``s`` is not such a list. Points and intervals
    (in brackets) are not lists. A single number is a list of one."""
    s = s.strip()
    inner = _SET_BRACES.match(s)
    if inner:
        s = inner.group(1)
    elif s[:1] in "([" or s[-1:] in ")]":
        return None
    values: list[Fraction] = []
    for part in _SEPARATORS.split(s):
        part = drop_assignment(part.strip())
        if not part:
            continue
        if pm := _PLUS_MINUS.match(part):
            center = plain_number(pm.group(1).strip() or "0")
            spread = plain_number(pm.group(2).strip())
            if center is None or spread is None or center.percent or spread.percent:
                return None
            values += [center.value - spread.value, center.value + spread.value]
            continue
        number = plain_number(part)
        if number is None or number.percent:
            return None
        values.append(number.value)
    return sorted(values) if values else None


_MATRIX = re.compile(
    r"^(?:\\left\s*)?[\[(]?\s*\\begin\{(?:(p|b|B)?matrix|array)\}(?:\{[lcr|]*\})?(.*?)"
    r"\\end\{(?:(?:p|b|B)?matrix|array)\}\s*(?:\\right\s*)?[\])]?$",
    re.DOTALL,
)


def matrix_cells(s: str) -> list[list[str]] | None:
    """Rows of cells of a matrix written with pmatrix, bmatrix, Bmatrix, matrix or a bracketed
    array; None for anything else (vmatrix is a determinant, not a matrix)."""
    if (m := _MATRIX.match(s.strip())) is None:
        return None
    rows = [r for r in re.split(r"\\\\", m.group(2)) if r.strip()]
    return [[c.strip() for c in row.split("&")] for row in rows] or None

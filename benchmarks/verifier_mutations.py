"""Mutants of the shipped gold answers: answers that look like the gold but are not equal to it.

Every gold answer of the shipped problem sets is changed in ways that change its value: a term
added, the sign flipped, a digit changed, the value inverted, ``+`` and ``-`` swapped, a factor or
term written with ``\\text`` / ``\\mathrm`` / ``\\operatorname`` or a malformed macro
(``\\sqrt(17)``), a hedge (``42\\text{ (or maybe 17)}``). A mutant is kept only when sympy confirms
its value differs from the gold's: for arithmetic mutants the mutant's value is built in sympy from
the gold's (never by parsing the mutant, which is what is under test), for string mutants (a digit,
a sign) both sides are parsed and compared at 50 digits, element by element for tuples, sets,
intervals and matrices. A verifier should accept none of them.

Used by ``tests/reward/test_mutations.py`` (zero accepts, strict and lenient) and by
``benchmarks/verifier.py`` (the counts beside math-verify's).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from functools import lru_cache

SETS = ("aime2024", "aime2025", "amc2023", "hmmt_feb_2025", "math500", "paraphrased")


@dataclass(frozen=True)
class Mutant:
    gold: str
    text: str  # the mutated answer, LaTeX as a policy would box it
    kind: str


def _value(latex: str):
    """The gold's sympy value through math-verify's parser (the gold is trusted), or None when it
    does not read the whole string."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    try:
        parsed = parse(f"${latex}$", extraction_config=config, parsing_timeout=None)
    except Exception:  # noqa: BLE001 - an unreadable gold gets no mutants
        return None
    if len(parsed) != 2:
        return None
    read, whole = "".join(str(parsed[1]).split()), "".join(latex.split())
    if read != whole and whole.startswith(read):
        return None
    return parsed[0]


def _atomic(g: str) -> str:
    """``g`` as one factor: in parentheses when it has a top-level sum or a relation."""
    depth = 0
    for i, c in enumerate(g):
        if c in "{([":
            depth += 1
        elif c in "})]":
            depth -= 1
        elif c in "+-=<>," and depth == 0 and i > 0:
            return f"\\left({g}\\right)"
    return g


def _points(n: int):
    import sympy

    return [
        [sympy.Rational(7 + 3 * k + i, 3 + k + 2 * i) for i in range(n)]
        for k in range(3)  # three points of positive rationals
    ]


def differs(a, b) -> bool:
    """True only when sympy shows ``a`` and ``b`` are different values: numbers differ at 50
    digits, expressions at a rational point, tuples/matrices/sets/intervals element by element.
    False when it cannot tell (the mutant is then not used)."""
    import sympy

    try:
        if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
            if a.has(sympy.zoo, sympy.nan) or b.has(sympy.zoo, sympy.nan):
                return False
            symbols = sorted(a.free_symbols | b.free_symbols, key=str)
            for point in _points(len(symbols)) if symbols else [[]]:
                sub = dict(zip(symbols, point, strict=True))
                x, y = sympy.N(a.subs(sub), 50), sympy.N(b.subs(sub), 50)
                if (
                    not (x.is_number and y.is_number)
                    or x.has(sympy.zoo, sympy.nan)
                    or y.has(sympy.zoo, sympy.nan)
                ):
                    return False
                if abs(x - y) > sympy.Float(10) ** -30 * max(1, abs(x)):
                    return True
            return False
        if isinstance(a, sympy.Interval) and isinstance(b, sympy.Interval):
            return (
                a.left_open != b.left_open
                or a.right_open != b.right_open
                or differs(a.start, b.start)
                or differs(a.end, b.end)
            )
        if isinstance(a, (sympy.Tuple, tuple)) and isinstance(b, (sympy.Tuple, tuple)):
            return len(a) != len(b) or any(differs(x, y) for x, y in zip(a, b, strict=True))
        if isinstance(a, sympy.MatrixBase) and isinstance(b, sympy.MatrixBase):
            return a.shape != b.shape or any(differs(x, y) for x, y in zip(a, b, strict=True))
        if isinstance(a, sympy.FiniteSet) and isinstance(b, sympy.FiniteSet):
            if len(a) != len(b):
                return True
            # every element of a differs from every element of b's matching candidates
            return any(all(differs(x, y) for y in b.args) for x in a.args)
        if isinstance(a, sympy.Union) and isinstance(b, sympy.Union):
            return len(a.args) != len(b.args) or any(all(differs(x, y) for y in b.args) for x in a.args)
    except Exception:  # noqa: BLE001 - cannot tell
        return False
    return False


def _change_digit(g: str) -> str | None:
    m = re.search(r"\d", g)
    if m is None:
        return None
    d = int(m.group(0))
    return f"{g[: m.start()]}{(d + 1) % 10 if d != 9 else 8}{g[m.end() :]}"


def _swap_sign(g: str) -> str | None:
    m = re.search(r"(?<=[\w})\]])\s*([+-])\s*(?=[\w\\({])", g)
    if m is None:
        return None
    return f"{g[: m.start(1)]}{'-' if m.group(1) == '+' else '+'}{g[m.end(1) :]}"


def candidates(gold: str):
    """(mutant text, kind, its sympy value or None to parse it) for one gold answer."""
    import sympy

    g = gold.strip()
    x, anything = sympy.Symbol("x"), sympy.Symbol("anything")
    value = _value(g)
    out = []
    for text, kind in ((_change_digit(g), "change a digit"), (_swap_sign(g), "swap + and -")):
        if text is not None:
            out.append((text, kind, None))
    if not isinstance(value, sympy.Expr):
        return value, out
    a = _atomic(g)
    out += [
        (f"{a} + 1", "add a term", value + 1),
        (f"{a} + \\sqrt{{2}}", "add a term", value + sympy.sqrt(2)),
        (f"-{a}", "flip the sign", -value),
        (f"\\frac{{1}}{{{g}}}", "invert", 1 / value),
        (f"{a} \\cdot \\text{{x}}", "\\text factor", value * x),
        (f"{a}\\,\\mathrm{{x}}", "\\mathrm factor", value * x),
        (f"{a} + \\text{{anything}}", "\\text term", value + anything),
        (f"{a} + \\mathrm{{e}}", "\\mathrm term", value + sympy.E),
        (f"{a} \\cdot \\mathrm{{e}}", "\\mathrm factor", value * sympy.E),
        (f"{a} - \\frac{{1}}{{\\mathrm{{e}}}}", "\\mathrm term", value - 1 / sympy.E),
        (
            f"{a} \\operatorname{{f}}(1)",
            "\\operatorname factor",
            value * sympy.Symbol("f_of_1"),
        ),  # an unknown value
        (f"{a} + \\operatorname{{Li}}(2)", "\\operatorname term", value + sympy.polylog(2, 2)),
        (f"{a}\\sqrt(17)", "malformed macro", value * sympy.sqrt(17)),
        (f"{a} \\cdot \\sqrt(3)", "malformed macro", value * sympy.sqrt(3)),
        (f"{a} \\cdot \\frac(1)(3)", "malformed macro", value / 3),
        (f"{a} \\cdot \\foo{{3}}", "unknown macro", value * sympy.Symbol("foo3")),
        (f"{a}\\text{{ (or maybe 17)}}", "hedge", sympy.FiniteSet(value, 17)),
        (f"{a} \\text{{ or }} {a} + 1", "hedge", sympy.FiniteSet(value, value + 1)),
        (f"\\pm {a}", "hedge", sympy.FiniteSet(value, -value)),
    ]
    return value, out


@lru_cache(maxsize=1)
def mutants() -> tuple[Mutant, ...]:
    """Every confirmed mutant of every gold answer of the shipped sets (deterministic)."""
    import sympy

    from rstar2.problems import load_problems

    golds = sorted({str(r["answer"]).strip() for name in SETS for r in load_problems(name)})
    kept: list[Mutant] = []
    for gold in golds:
        value, cands = candidates(gold)
        if value is None:
            continue
        seen = set()
        for text, kind, meaning in cands:
            if text in seen or "".join(text.split()) == "".join(gold.split()):
                continue
            seen.add(text)
            if isinstance(
                meaning, sympy.FiniteSet
            ):  # a hedge: different unless all its values are the gold's
                ok = any(differs(value, v) for v in meaning.args) if isinstance(value, sympy.Expr) else False
            else:
                other = meaning if meaning is not None else _value(text)
                ok = other is not None and differs(value, other)
            if ok:
                kept.append(Mutant(gold, text, kind))
    return tuple(kept)


def main() -> None:
    from collections import Counter

    found = mutants()
    print(len(found), "mutants of", len({m.gold for m in found}), "golds")
    for kind, n in sorted(Counter(m.kind for m in found).items()):
        print(f"  {kind}: {n}")


if __name__ == "__main__":
    main()

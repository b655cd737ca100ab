"""Is an extracted answer equal to the reference? ``quick_check`` is pure string and ``Fraction``
work, safe anywhere, and decides most RL rewards (integers) in microseconds; ``cas_check`` hands
the rest to ``math-verify`` with decimals made exact and closed-form numbers compared to 40 digits,
so rounding never makes two different numbers equal. A CAS call can take unbounded time: callers
run it under a time box (``verifier_pool.py``)."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from ..config import DEFAULT_ROLLOUT
from .extract import Mode, extract_answer
from .forms import listed_numbers, matrix_cells, normalize_pair, top_level_items
from .guards import MAX_CHARS, refuse, stray_words
from .macros import hedges
from .normalize import (
    has_decimal_literal,
    is_float_print,
    plain_number,
    rationalize_decimals,
    same_plain_number,
    text_answer,
)


@dataclass
class Verdict:
    """The outcome of one check; truthy when the answer is correct."""

    correct: bool
    reason: str
    answer: str | None = None  # the extracted answer that was graded
    path: str = "fast"  # fast | text | guard | cas | task | none | timeout | stalled | error
    seconds: float = 0.0

    def __bool__(self) -> bool:
        return self.correct

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        return cls(**{k: data[k] for k in ("correct", "reason", "answer", "path", "seconds") if k in data})


def quick_check(reference: str, answer: str) -> Verdict | None:
    """A verdict without any CAS work, or None when the CAS must decide."""
    if len(answer) > 2 * MAX_CHARS:  # before any regex: normalizing megabytes is not free
        return Verdict(False, f"refused: answer longer than {MAX_CHARS} characters", answer, "guard")
    ref, ans = normalize_pair(reference, answer)
    if not ans:
        return Verdict(False, "empty answer", answer, "none")
    if ref == ans or ref.replace(" ", "") == ans.replace(" ", ""):
        return Verdict(True, "identical", answer, "fast")
    ref_num, ans_num = plain_number(ref), plain_number(ans)
    if ref_num is not None and ans_num is not None:
        if same_plain_number(ref_num, ans_num):
            return Verdict(True, "equal numbers", answer, "fast")
        if is_float_print(ref_num, ans_num) or is_float_print(ans_num, ref_num):
            return Verdict(True, "a float print of the fraction", answer, "fast")
        return Verdict(False, "different numbers", answer, "fast")
    if (listed := _same_listed_numbers(ref, ans)) is not None:
        return Verdict(listed, "same numbers" if listed else "different numbers", answer, "fast")
    if (cells := _same_matrix(ref, ans)) is not None:
        return Verdict(cells, "equal matrices" if cells else "different matrices", answer, "fast")
    if (ref_text := text_answer(ref)) is not None:
        same = text_answer(ans) == ref_text
        return Verdict(same, "same words" if same else "different words", answer, "text")
    why = _hedged(ref, ans) or refuse(ans)
    words = stray_words(ans) - stray_words(ref)
    if why is None and words and not _has_letters(ref):  # a numeric reference: words are no mathematics
        why = f"words beside the value ({', '.join(sorted(words))})"
    if why is not None:
        return Verdict(False, f"refused: {why}", answer, "guard")
    if (why := refuse(ref)) is not None:
        return Verdict(False, f"reference refused: {why}", answer, "guard")
    return None


def _single_value(ref: str) -> bool:
    return (
        len(top_level_items(ref)) <= 1
        and "\\pm" not in ref
        and "\\mp" not in ref
        and re.search(r"\b(?:or|and)\b", ref) is None
    )


def _hedged(ref: str, ans: str) -> str | None:
    """Why ``ans`` hedges where the reference states one thing, or None when it does not."""
    single = _single_value(ref)
    words = hedges(ans, ref) - (set() if single else {"or"})
    if words:
        return f"a hedged answer ({', '.join(sorted(words))})"
    if single and ("\\pm" in ans or "\\mp" in ans):
        return "\\pm against a single value"
    if single and len(top_level_items(ans)) > 1:
        return "several values against a single value"
    return None


def _same_listed_numbers(ref: str, ans: str) -> bool | None:
    """Two lists of plain numbers ("2, 3" and "x = 3 or x = 2") are equal as multisets."""
    if not any(sep in ref + ans for sep in (",", ";", "or", "and", "\\pm")):
        return None
    a, b = listed_numbers(ref), listed_numbers(ans)
    if a is None or b is None or (len(a) == 1 and len(b) == 1):
        return None
    return a == b


def _same_matrix(ref: str, ans: str) -> bool | None:
    """Two matrices compared cell by cell; None when a cell needs the CAS or either is no matrix."""
    a, b = matrix_cells(ref), matrix_cells(ans)
    if a is None or b is None:
        return None
    if [len(r) for r in a] != [len(r) for r in b]:
        return False
    for x, y in zip((c for r in a for c in r), (c for r in b for c in r), strict=True):
        if (cell := quick_check(x, y)) is None:
            return None
        if not cell.correct:
            return False
    return True


def _has_letters(s: str) -> bool:
    return re.search(r"(?<!\\)\b[A-Za-z]", re.sub(r"\\[A-Za-z]+", " ", s)) is not None


def triage(
    reference: str,
    response: str,
    *,
    mode: Mode = DEFAULT_ROLLOUT.verify_mode,
    extracted: bool = False,
    fast: bool = True,
) -> tuple[Verdict | None, str | None]:
    """The part of a check every caller runs locally: find the answer, try the fast path (unless
    ``fast`` is off: another scorer decides); ``(None, answer)`` when a checker must judge it under
    a time box."""
    answer = response if extracted else extract_answer(response, mode)
    if answer is None:
        return Verdict(False, "no answer found", None, "none"), None
    return (quick_check(str(reference), answer) if fast else None), answer


def cas_check(reference: str, answer: str) -> Verdict:
    """Equivalence through math-verify; may be slow, so run it in a time-boxed worker."""
    from math_verify import verify

    ref, ans = normalize_pair(reference, answer)
    if has_decimal_literal(ref) or has_decimal_literal(ans):
        ref, ans = rationalize_decimals(ref), rationalize_decimals(ans)
    gold, pred = _parse(ref), _parse(ans)
    if not gold:
        return Verdict(False, "reference not parseable", answer, "cas")
    if not pred:
        return Verdict(False, "answer not parseable", answer, "cas")
    # decided here where they can be, without math-verify's slow simplify()
    for decide in (_same_equation, _numeric_verdict, _equal_for_positive_unknowns):
        same = decide(gold[0], pred[0])
        if same is not None:
            break
    else:
        # decimals are exact fractions by now, so math-verify's numeric comparison has no floats to
        # round; 50 digits keeps its "(a - b).evalf() == 0" from calling near-equal numbers equal
        same = verify(gold, pred, numeric_precision=50, timeout_seconds=None)
    return Verdict(same, "equivalent" if same else "not equivalent", answer, "cas")


def check_answer(reference: str, answer: str) -> Verdict:
    """Both steps in this process, with no time box (the pool adds one)."""
    start = time.perf_counter()
    verdict = quick_check(reference, answer)
    if verdict is None:
        try:
            verdict = cas_check(reference, answer)
        except Exception as exc:  # noqa: BLE001 - any CAS failure means "not shown equal"
            verdict = Verdict(False, f"CAS error: {type(exc).__name__}", answer, "error")
    verdict.seconds = time.perf_counter() - start
    return verdict


def warm_up() -> None:
    """Load the LaTeX grammar and sympy caches once, before the first timed check."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    cas_check("\\frac{1}{2}", "\\sqrt{\\frac{1}{4}}")


def _parse(latex: str) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    parsed = parse(f"${latex}$", extraction_config=config, parsing_timeout=None)  # type: ignore[arg-type]
    # math-verify may read a prefix of the answer ("1 + \\frac{1}{" of a longer one) and drop the rest:
    # a parse counts only when it read the whole answer
    if len(parsed) == 2 and isinstance(parsed[1], str):
        read, whole = "".join(parsed[1].split()), "".join(latex.split())
        if read != whole and whole.startswith(read):
            return []
    return parsed


def _same_equation(gold: Any, pred: Any) -> bool | None:
    """For two equations in the same unknowns: equivalent when one is the other times a nonzero
    constant (``2x + 4y = 8`` and ``y = 2 - x/2``: ``(lhs - rhs)`` of one over that of the other
    cancels to a number), else not. None when the pair is not two such equations."""
    import sympy

    if not isinstance(gold, sympy.Equality) or not isinstance(pred, sympy.Equality):
        return None
    a, b = gold.lhs - gold.rhs, pred.lhs - pred.rhs
    if not a.free_symbols or len(a.free_symbols) > 4:
        return None
    if a.free_symbols != b.free_symbols:
        return False
    try:
        ratio = sympy.cancel(sympy.together(a / b))
        return not ratio.free_symbols and ratio.is_number and bool(ratio != 0) and ratio.is_finite is True
    except Exception:  # noqa: BLE001 - not shown equivalent
        return False


_POINTS = (
    (Fraction(7, 3), Fraction(11, 5), Fraction(13, 7), Fraction(17, 4)),
    (Fraction(5, 2), Fraction(19, 6), Fraction(3, 8), Fraction(23, 9)),
)


def _equal_for_positive_unknowns(gold: Any, pred: Any) -> bool | None:
    """For two expressions in the same unknowns (competition unknowns are lengths, counts,
    positive reals): False when they differ at a positive point, True when sympy shows them equal
    for positive unknowns, None to leave it to math-verify (and for expressions with ``|x|`` or
    sign-like functions, where "positive" would erase the difference)."""
    import sympy

    if not isinstance(gold, sympy.Expr) or not isinstance(pred, sympy.Expr):
        return None
    symbols = sorted(gold.free_symbols | pred.free_symbols, key=str)
    if not symbols or len(symbols) > 4 or gold.free_symbols != pred.free_symbols:
        return None
    if any(e.has(sympy.Abs, sympy.sign, sympy.Piecewise, sympy.Min, sympy.Max) for e in (gold, pred)):
        return None
    try:
        diff = gold - pred
        for point in _POINTS:
            at = dict(zip(symbols, map(sympy.Rational, point), strict=False))
            value = sympy.N(diff.subs(at), 30)
            if not value.is_number or value.has(sympy.zoo, sympy.nan):
                return None
            if abs(value) > sympy.Float(10) ** -20 * max(1, abs(sympy.N(gold.subs(at), 30))):
                return False
        positive = {x: sympy.Symbol(x.name, positive=True) for x in symbols}
        return True if sympy.simplify(diff.subs(positive)) == 0 else None
    except Exception:  # noqa: BLE001 - leave it to math-verify
        return None


def _numeric_verdict(gold: Any, pred: Any) -> bool | None:
    """Equal or not for two closed-form numbers (no symbols, sets, relations), else None: both
    to 50 digits decide most pairs without sympy's ``simplify``, what makes a CAS check slow."""
    import sympy

    if not isinstance(gold, sympy.Expr) or not isinstance(pred, sympy.Expr):
        return None
    try:
        gold, pred = gold.doit(), pred.doit()
        if any(e.free_symbols or e.has(sympy.UnevaluatedExpr) for e in (gold, pred)):
            return None
        g, p = sympy.N(gold, 50), sympy.N(pred, 50)
        if any(not e.is_number or e.has(sympy.zoo, sympy.nan) or e.is_infinite for e in (g, p)):
            return None
        scale = max(sympy.Float(1), abs(g))
        return bool(abs(g - p) < sympy.Float(10) ** -40 * scale)
    except Exception:  # noqa: BLE001 - leave it to math-verify
        return None

"""Is an extracted answer equal to the reference? Decided in two steps.

``quick_check`` is pure string and ``Fraction`` work, safe to run anywhere: identical strings,
plain numbers (exact), word answers (as strings) and the input guards. It decides most RL
rewards (integers) in microseconds. ``cas_check`` hands the rest to ``math-verify`` (LaTeX
parsing and sympy equivalence) with decimals made exact and closed-form numbers compared to
40 digits, so rounding never makes two different numbers equal. A CAS call
can take unbounded time: callers run it under a time box (``rstar2.reward.pool``). ``triage``
is the local part every caller shares: extraction, then ``quick_check``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from .extract import Mode, extract_answer
from .guards import DEFAULT_LIMITS, GuardLimits, refuse
from .normalize import (
    has_decimal_literal,
    normalize,
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
    path: str = "fast"  # fast | text | guard | cas | none | timeout | stalled | error
    seconds: float = 0.0

    def __bool__(self) -> bool:
        return self.correct

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        return cls(**{k: data[k] for k in ("correct", "reason", "answer", "path", "seconds") if k in data})


def quick_check(reference: str, answer: str, limits: GuardLimits = DEFAULT_LIMITS) -> Verdict | None:
    """A verdict without any CAS work, or None when the CAS must decide."""
    ref, ans = normalize(reference), normalize(answer)
    if not ans:
        return Verdict(False, "empty answer", answer, "none")
    if ref == ans or ref.replace(" ", "") == ans.replace(" ", ""):
        return Verdict(True, "identical", answer, "fast")
    ref_num, ans_num = plain_number(ref), plain_number(ans)
    if ref_num is not None and ans_num is not None:
        same = same_plain_number(ref_num, ans_num)
        return Verdict(same, "equal numbers" if same else "different numbers", answer, "fast")
    ref_text = text_answer(ref)
    if ref_text is not None:
        ans_text = text_answer(ans)
        same = ans_text == ref_text
        return Verdict(same, "same words" if same else "different words", answer, "text")
    why = refuse(ans, limits)
    if why is not None:
        return Verdict(False, f"refused: {why}", answer, "guard")
    why = refuse(ref, limits)
    if why is not None:
        return Verdict(False, f"reference refused: {why}", answer, "guard")
    return None


def triage(
    reference: str,
    response: str,
    *,
    mode: Mode = "strict",
    extracted: bool = False,
    limits: GuardLimits = DEFAULT_LIMITS,
) -> tuple[Verdict | None, str | None]:
    """The part of a check every caller runs locally: find the answer, try the fast path.

    Returns ``(verdict, answer)``: a verdict when decided here (no answer, fast path, guards),
    else ``(None, answer)`` for the CAS to judge under a time box.
    """
    answer = response if extracted else extract_answer(response, mode)
    if answer is None:
        return Verdict(False, "no answer found", None, "none"), None
    return quick_check(str(reference), answer, limits), answer


def cas_check(reference: str, answer: str) -> Verdict:
    """Equivalence through math-verify; may be slow, so run it in a time-boxed worker."""
    from math_verify import verify

    ref, ans = normalize(reference), normalize(answer)
    exact = has_decimal_literal(ref) or has_decimal_literal(ans)
    if exact:
        ref, ans = rationalize_decimals(ref), rationalize_decimals(ans)
    gold, pred = _parse(ref), _parse(ans)
    if not gold:
        return Verdict(False, "reference not parseable", answer, "cas")
    if not pred:
        return Verdict(False, "answer not parseable", answer, "cas")
    numeric = _numeric_verdict(gold[0], pred[0])
    if numeric is not None:  # two closed-form numbers: decided to 40 digits, no simplify()
        return Verdict(numeric, "equivalent" if numeric else "not equivalent", answer, "cas")
    # decimals are exact fractions by now, so math-verify's numeric comparison has no floats to
    # round; 50 digits keeps its "(a - b).evalf() == 0" from calling near-equal numbers equal
    same = verify(gold, pred, numeric_precision=50, timeout_seconds=None)
    return Verdict(same, "equivalent" if same else "not equivalent", answer, "cas")


def check_answer(reference: str, answer: str, limits: GuardLimits = DEFAULT_LIMITS) -> Verdict:
    """Both steps in this process, with no time box (the pool adds one)."""
    start = time.perf_counter()
    verdict = quick_check(reference, answer, limits)
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
    return parse(f"${latex}$", extraction_config=config, parsing_timeout=None)  # type: ignore[arg-type]


def _numeric_verdict(gold: Any, pred: Any) -> bool | None:
    """Equal or not for two closed-form numbers (no symbols, sets, relations), else None.

    Evaluating both to 50 digits decides most MATH-style pairs (radicals, pi, fractions) without
    sympy's ``simplify``, which is what makes a CAS check slow.
    """
    import sympy

    if not isinstance(gold, sympy.Expr) or not isinstance(pred, sympy.Expr):
        return None
    try:
        gold, pred = gold.doit(), pred.doit()
        if (
            gold.free_symbols
            or pred.free_symbols
            or gold.has(sympy.UnevaluatedExpr)
            or pred.has(sympy.UnevaluatedExpr)
        ):
            return None
        g, p = sympy.N(gold, 50), sympy.N(pred, 50)
        if not (g.is_number and p.is_number) or g.has(sympy.zoo, sympy.nan) or p.has(sympy.zoo, sympy.nan):
            return None
        if g.is_infinite or p.is_infinite:
            return None
        scale = max(sympy.Float(1), abs(g))
        return bool(abs(g - p) < sympy.Float(10) ** -40 * scale)
    except Exception:  # noqa: BLE001 - leave it to math-verify
        return None

"""Precision under mutation (issue 14): no gold answer of the shipped sets, changed so that sympy
confirms it is no longer equal, is accepted, in strict mode (the RL reward) or in lenient mode.

The mutants come from ``benchmarks/verifier_mutations.py`` (shared with the benchmark, which
reports math-verify's count beside ours). Each mutant is checked in this process, without the
pool's time box: a check that is slow shows up as a slow test, not as a silent reject.
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import sympy

from benchmarks.verifier_mutations import candidates, differs, mutants
from rstar2.reward import check_answer, extract_answer


@pytest.fixture(scope="module")
def found():
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return mutants()


def test_the_mutation_set_covers_every_kind_and_most_golds(found):
    kinds = Counter(m.kind for m in found)
    assert len({m.gold for m in found}) >= 400, "golds the mutants come from"
    for kind in (
        "add a term",
        "flip the sign",
        "change a digit",
        "invert",
        "swap + and -",
        "\\text factor",
        "\\text term",
        "\\mathrm factor",
        "\\operatorname factor",
        "malformed macro",
        "hedge",
    ):
        assert kinds[kind] > 0, kind


def test_sympy_confirms_only_real_differences():
    # the oracle itself: equal spellings are never "different", different values always are
    value, _ = candidates("\\frac{1}{2}")
    assert not differs(value, sympy.Rational(1, 2))
    assert differs(value, sympy.Rational(1, 2) + sympy.Symbol("x"))
    assert not differs(sympy.sqrt(8), 2 * sympy.sqrt(2))
    assert differs(sympy.Tuple(1, 2), sympy.Tuple(2, 1))
    assert not differs(sympy.FiniteSet(1, 2), sympy.FiniteSet(2, 1))
    assert differs(sympy.Interval(0, 1), sympy.Interval.Ropen(0, 1))


@pytest.mark.parametrize("mode", ["strict", "lenient"])
def test_no_mutant_is_accepted(found, mode):
    accepted = []
    for m in found:
        response = f"<answer>\\boxed{{{m.text}}}</answer>" if mode == "strict" else m.text
        answer = extract_answer(response, mode)
        if answer is not None and check_answer(m.gold, answer).correct:
            accepted.append(m)
    assert accepted == [], f"{len(accepted)} of {len(found)} mutants accepted, e.g. {accepted[:5]}"


@pytest.mark.parametrize(
    ("gold", "mutant"),
    [  # the issue's own table, for the reference 42
        ("42", "42\\text{ (or maybe 17)}"),
        ("42", "42 + \\text{anything}"),
        ("42", "42\\sqrt(17)"),
        ("42", "42 \\cdot \\text{x}"),
        ("1 + \\frac{1}{\\mathrm{e}}", "1 - \\frac{1}{\\mathrm{e}}"),
    ],
)
def test_the_reported_false_accepts_are_refused(gold, mutant):
    assert not check_answer(gold, extract_answer(f"<answer>\\boxed{{{mutant}}}</answer>")).correct

"""Equivalence on hand-checked pairs: each row is (reference, answer, expected verdict)."""

import pytest

from rstar2.reward import check_answer, quick_check

EQUAL = [
    # integers and plain numbers (fast path)
    ("70", "70"),
    ("70", "070"),
    ("1500", "1.5e3"),
    ("1500", "1.5\\times 10^{3}"),
    (".0000672", "6.72\\times10^{-5}"),
    ("10,\\!080", "10080"),
    ("11,\\! 111,\\! 111,\\! 100", "11111111100"),
    ("58,500", "58500"),
    ("\\$32,\\!348", "32348"),
    ("\\$18.90", "18.9"),
    ("204", "204."),
    ("0.15", "\\frac{3}{20}"),
    ("\\frac{3}{2}", "1.5"),
    ("\\frac43", "4/3"),
    ("\\frac 59", "\\dfrac{5}{9}"),
    ("1\\frac{4}{5}", "\\frac95"),
    ("137 \\frac{1}{2}", "137.5"),
    ("-\\frac{35}{9}", "-35/9"),
    # percentages: the sign is a decoration or /100, never x100 in the other direction
    ("50\\%", "50"),
    ("0.5", "50\\%"),
    ("25", "25\\%"),
    # units and degrees
    ("90^\\circ", "90"),
    ("30^\\circ", "30^{\\circ}"),
    ("864 \\mbox{ inches}^2", "864"),
    ("5.4 \\text{ cents}", "5.4"),
    ("\\frac{270}7\\text{ degrees}", "\\frac{270}{7}"),
    # words and choices
    ("\\text{(C)}", "C"),
    ("\\text{(C)}", "\\textbf{(C)}"),
    ("\\text{Evelyn}", "Evelyn"),
    ("\\text{east}", "East"),
    # assignments and membership
    ("x=5", "5"),
    ("5", "x = 5"),
    ("x \\in [-2,7]", "[-2,7]"),
    ("y = 2x + 3", "y=3+2x"),
    # radicals, pi, complex numbers (CAS)
    ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt3}"),
    ("\\sqrt{\\frac{95}{24}}", "\\frac{\\sqrt{570}}{12}"),
    ("3\\sqrt{13}", "\\sqrt{117}"),
    ("18+2\\pi", "2\\pi+18"),
    ("1-\\frac{2}{\\pi}", "\\frac{\\pi-2}{\\pi}"),
    ("-2 + 7i", "7i-2"),
    ("2^{25} \\cdot 26!", "26!\\cdot 2^{25}"),
    ("2k+2", "2(k+1)"),
    # sets, tuples, intervals, matrices
    ("3, 5, 7", "7,5,3"),
    ("\\{1\\pm\\sqrt{5},-2\\}", "-2, 1+\\sqrt5, 1-\\sqrt5"),
    ("1 \\pm \\sqrt{19}", "1+\\sqrt{19}, 1-\\sqrt{19}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
    ("(3,4]", "(3, 4]"),
    ("(-\\infty, 0]", "(-\\infty,0]"),
    ("(0,9) \\cup (9,36)", "(0,9)\\cup(9,36)"),
    (
        "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
        "\\begin{pmatrix} -\\frac13 \\\\ \\frac23 \\\\ \\frac53 \\end{pmatrix}",
    ),
    # bases
    ("52_8", "52_{8}"),
    ("4210_{5}", "4210_5"),
]

NOT_EQUAL = [
    ("70", "71"),
    ("12345678", "12345679"),
    ("100", "100.0000001"),
    ("1/3", "0.333333"),  # rounds alike, is not equal
    ("\\frac13", "0.33"),
    ("\\pi", "3.14"),  # pi is not 3.14
    ("\\pi", "3.14159265358979"),
    ("2\\pi", "6.28"),
    ("50", "0.5"),  # x100 percent confusion
    ("0.5", "50"),
    ("\\text{Evelyn}", "Evenly"),  # a CAS reads both as the product E*v*e*l*n*y
    ("\\text{(C)}", "(D)"),
    ("(3,4]", "[3,4]"),  # open vs closed
    ("(-\\infty, 0]", "(-\\infty,0)"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,1.5708)"),
    ("e", "2.718"),
    ("p - q", "q-p"),
    ("3\\sqrt{13}", "3\\sqrt{12}"),
    ("1,-2", "1,2"),
    ("x=5", "x=6"),
    ("33", "9^9^9^9"),
    ("33", "100000!"),
]


@pytest.mark.parametrize(("reference", "answer"), EQUAL)
def test_equal(verifier, reference, answer):
    verdict = verifier.check(reference, answer, extracted=True)
    assert verdict.correct, verdict


@pytest.mark.parametrize(("reference", "answer"), NOT_EQUAL)
def test_not_equal(verifier, reference, answer):
    verdict = verifier.check(reference, answer, extracted=True)
    assert not verdict.correct, verdict


def test_integers_never_reach_the_cas():
    for ref, ans, same in [("117", "117", True), ("117", "118", False), ("-3", "-3.0", True)]:
        verdict = quick_check(ref, ans)
        assert verdict is not None and verdict.path == "fast" and verdict.correct is same


def test_guards_refuse_before_any_cas_work():
    for answer in ["9^{9^{9^{9}}}", "100000!", "(" * 1000 + "x" + ")" * 1000, "1" * 5000, "2^{100000000}"]:
        verdict = quick_check("33", answer)
        assert verdict is not None and verdict.path == "guard" and not verdict.correct, answer
    deep = "(" * 60 + "1" + ")" * 60
    assert "nested" in quick_check("1", deep).reason


def test_the_reference_itself_is_accepted_even_when_large():
    assert quick_check("2^{100000000}", "2^{100000000}").correct


def test_check_answer_in_process_reports_the_path():
    verdict = check_answer("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}")
    assert verdict.correct and verdict.path == "cas" and verdict.seconds > 0

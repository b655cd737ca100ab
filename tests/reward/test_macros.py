"""Issue 14: one rule for text macros, hedges refused, and the free-form kinds lenient now reads."""

import pytest

from rstar2.reward import check_answer, extract_answer
from rstar2.reward.extract import cut_next_turn, last_boxes
from rstar2.reward.forms import top_level_items
from rstar2.reward.macros import read_malformed, resolve, unreadable
from rstar2.reward.normalize import drop_assignment


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("1 + \\frac{1}{\\mathrm{e}}", "1 + \\frac{1}{e}"),  # a symbol: its content stays
        ("42 \\cdot \\text{x}", "42 \\cdot x"),
        ("\\mathrm{e}^{2}", "e^{2}"),
        ("2^\\text{3}", "2^{3}"),
        ("42\\text{ cm}", "42"),  # a unit at the end of a whole answer
        ("10 \\textnormal{ miles}", "10"),
        ("36 \\mbox{ inches}^2", "36"),
        ("2 \\text{ and } 3", "2  and  3"),  # a separator
        ("\\operatorname{sin} x", "\\sin  x"),
        ("42 + \\text{anything}", "42 + \\text{anything}"),  # would leave "42 +": kept, then refused
        ("42\\text{ (or maybe 17)}", "42\\text{ (or maybe 17)}"),  # digits and hedges: not a unit
        ("42 \\text{ apples} + 1", "42 \\text{ apples} + 1"),  # not at the end
        ("\\operatorname{f}(1)", "\\operatorname{f}(1)"),  # an unknown function name
        ("\\text{Evelyn}", "\\text{Evelyn}"),  # a word answer
    ],
)
def test_text_macros_follow_one_rule(written, read):
    assert resolve(written) == read


def test_malformed_square_roots_are_read_as_written_and_others_refused():
    assert read_malformed("42\\sqrt(17)") == "42\\sqrt{17}"
    assert read_malformed("\\sqrt((1+2)(3))") == "\\sqrt{(1+2)(3)}"
    assert unreadable("2 \\frac(1)(2)") == "a malformed \\frac(...)"
    assert unreadable("42 + \\text{anything}") == "text inside the mathematics (\\text{...})"
    assert unreadable("42 \\foo") == "an unknown macro \\foo"
    assert unreadable("\\frac{\\sqrt{3}}{2} + \\pi \\cdot \\infty") is None


@pytest.mark.parametrize(
    ("reference", "answer", "reason"),
    [
        ("42", "42\\text{ (or maybe 17)}", "refused: a hedged answer (maybe, or)"),
        ("\\sqrt{2}", "\\pm\\sqrt{2}", "refused: \\pm against a single value"),
        ("\\sqrt{2}", "\\sqrt{2}, \\sqrt{3}", "refused: several values against a single value"),
        ("\\sqrt{2}", "\\sqrt{2} \\text{ or } \\sqrt{3}", "refused: a hedged answer (or)"),
        ("x + 1", "x + 1 \\text{ maybe}", "refused: a hedged answer (maybe)"),
    ],
)
def test_hedges_are_refused_with_a_reason(reference, answer, reason):
    verdict = check_answer(reference, answer)
    assert not verdict.correct and verdict.reason == reason


def test_listed_references_still_take_or():
    assert check_answer("1 \\pm \\sqrt{2}", "x = 1+\\sqrt2 \\text{ or } x = 1-\\sqrt2").correct
    assert check_answer("2, 3", "3 or 2").correct


def test_top_level_items_skip_brackets_and_thousands():
    assert top_level_items("(1,2), (2,1)") == ["(1,2)", "(2,1)"]
    assert top_level_items("10,455") == ["10,455"]
    assert top_level_items("1,234,567 people") == ["1,234,567 people"]
    assert top_level_items("1, 2; 3") == ["1", "2", "3"]


def test_a_reversed_assignment_states_its_value():
    assert drop_assignment("5 = x") == "5"
    assert drop_assignment("\\frac{1}{2} = a_1") == "\\frac{1}{2}"
    assert drop_assignment("2y = x") == "2y = x"  # letters on the left: an equation, kept


def test_boxes_in_a_row_are_one_listed_answer():
    assert last_boxes("so \\boxed{(1,2)}, \\boxed{(2,1)}") == "(1,2), (2,1)"
    assert last_boxes("$\\boxed{k=45}$ \\quad\\text{and}\\quad $\\boxed{n=2}$") == "k=45, n=2"
    assert last_boxes("we guessed \\boxed{5}, then found \\boxed{7}") == "7"  # prose between
    assert last_boxes("\\boxed{3}") == "3"
    assert last_boxes("no box") is None


def test_a_next_turn_ends_the_response():
    text = "The answer is 42. I hope it is correct. <|im_start|>user\nWhat is 2+2?"
    assert cut_next_turn(text) == "The answer is 42. I hope it is correct. "
    assert extract_answer(text + "<|im_start|>assistant\nThe answer is 4.", "lenient") == "42"


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("Count them.\nAnswer \\[ 9 \\]", "9"),
        ("Count them.\nAnswer\n$$\n 9 \n$$", "9"),
        ("Count them.\nAnswer \\( 9 \\)", "9"),
        ("Final Answer: The largest $n$ is 34.", "34"),
        ("Final Answer: The final answer is $42$. I hope it is correct.", "42"),
    ],
)
def test_lenient_reads_display_math_after_a_cue_and_prose_after_final_answer(response, expected):
    assert extract_answer(response, "lenient") == expected


def test_unknowns_are_positive_where_the_two_forms_differ_only_for_negatives():
    assert check_answer("\\frac{1}{\\sqrt{n}}", "\\sqrt{1/n}").correct
    assert not check_answer("\\frac{1}{\\sqrt{n}}", "\\sqrt{n}").correct
    assert not check_answer("|x|", "x").correct  # |x| keeps its sign: no positive shortcut

"""Every reference of the shipped AIME, MATH-500 and HMMT sets grades as correct when written
the ways a model writes it, and as wrong against a different answer."""

import pytest

from rstar2.problems import load_problems
from rstar2.reward.normalize import normalize, plain_number

SETS = ["aime2024", "aime2025", "hmmt_feb_2025", "math500"]


def written_by_a_model(ref: str) -> list[str]:
    return [
        f"<reason>so</reason><answer>\\boxed{{{ref}}}</answer>",
        f"<reason>We compute carefully.\nThe tool printed 12.</reason>\n<answer>The final answer is $\\boxed{{{ref}}}$.</answer>",
        f"<answer>$\\boxed{{ {ref} }}$</answer>",
        f"<answer>${ref}$</answer>",
        f"<answer>\\boxed{{{ref.replace(chr(92) + 'frac', chr(92) + 'dfrac').replace(' ', '')}}}</answer>",
    ]


def a_wrong_answer(rows: list[dict], i: int) -> str:
    ref = str(rows[i]["answer"])
    number = plain_number(normalize(ref))
    if number is not None and number.value.denominator == 1:
        return str(number.value + 1)
    for step in range(7, 7 + len(rows)):
        other = str(rows[(i + step) % len(rows)]["answer"])
        if normalize(other).replace(" ", "") != normalize(ref).replace(" ", ""):
            return other
    raise AssertionError("no distinct answer")


@pytest.mark.parametrize("name", SETS)
def test_references_verify_against_themselves(verifier, name):
    rows = load_problems(name)
    pairs = [(str(r["answer"]), resp) for r in rows for resp in written_by_a_model(str(r["answer"]))]
    verdicts = verifier.map(pairs)
    failed = [(ref, v.answer, v.reason) for (ref, _), v in zip(pairs, verdicts, strict=True) if not v.correct]
    assert not failed, failed[:10]


@pytest.mark.parametrize("name", SETS)
def test_references_reject_a_wrong_answer(verifier, name):
    rows = load_problems(name)
    pairs = [
        (str(r["answer"]), f"<answer>\\boxed{{{a_wrong_answer(rows, i)}}}</answer>")
        for i, r in enumerate(rows)
    ]
    verdicts = verifier.map(pairs)
    accepted = [(ref, v.answer, v.reason) for (ref, _), v in zip(pairs, verdicts, strict=True) if v.correct]
    assert not accepted, accepted[:10]
    assert not any(v.path == "timeout" for v in verdicts)

"""Synthetic problems with integer answers where the Python tool genuinely matters.

A tiny model cannot multiply 4-digit numbers or take powers modulo n in its head, but it can learn
to copy the numbers into a one-line program and copy the printed result into its answer. Every
family writes a short word problem, its answer and the program that solves it (the SFT demos).

Held-out problems are never training problems: a problem's split is fixed by a hash of its text,
so any two generated sets of different splits are disjoint whatever their seeds and sizes.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

HELDOUT_SHARE = 0.1  # the share of all possible problems reserved for evaluation


@dataclass(frozen=True)
class Task:
    family: str
    problem: str
    answer: int
    code: str  # a program that prints the answer

    def row(self) -> dict:
        return {"problem": self.problem, "answer": str(self.answer), "family": self.family}


def number(rng: random.Random, digits: tuple[int, int]) -> int:
    """An integer with a number of digits drawn uniformly from ``digits`` (inclusive)."""
    d = rng.randint(*digits)
    return rng.randint(10 ** (d - 1) if d > 1 else 1, 10**d - 1)


class Numbers:
    """Writes a problem's numbers: plain, or (varied wording) now and then with thousands separators."""

    def __init__(self, rng: random.Random, varied: bool) -> None:
        self.rng, self.varied = rng, varied

    def __call__(self, n: int) -> str:
        return f"{n:,}" if self.varied and n >= 1000 and self.rng.random() < 0.4 else str(n)

    def listed(self, xs: Sequence[int]) -> str:
        return f"{', '.join(map(self, xs[:-1]))} and {self(xs[-1])}"


def _write(rng: random.Random, varied: bool, wordings: Sequence[str], **values: int | list[int]) -> str:
    """The first wording (the plain generator's), or (varied) any of them, with ``values`` written
    in: a list as "a, b and c", large numbers now and then with thousands separators."""
    text = rng.choice(wordings) if varied else wordings[0]
    w = Numbers(rng, varied)
    return text.format(**{k: w.listed(v) if isinstance(v, list) else w(v) for k, v in values.items()})


def _product(rng, digits, varied=False):
    a, b = number(rng, digits), number(rng, digits)
    text = _write(
        rng,
        varied,
        [
            "A shop has {a} boxes with {b} pens in each box. How many pens does it have?",
            "There are {a} rows of seats with {b} seats in each row. How many seats are there in total?",
            "{a} students each bring {b} pencils. How many pencils do they bring altogether?",
            "A bakery bakes {b} loaves every day for {a} days. How many loaves does it bake?",
            "Multiply {a} by {b}.",
            "What is the product of {a} and {b}?",
        ],
        a=a,
        b=b,
    )
    return text, a * b, f"print({a} * {b})"


def _sum(rng, digits, varied=False):
    xs = [number(rng, digits) for _ in range(rng.randint(3, 4))]
    text = _write(
        rng,
        varied,
        [
            "What is the sum of {items}?",
            "Add {items}.",
            "Find the total of {items}.",
            "A library received {items} books in successive months. How many books did it receive in all?",
            "The shelves of a storeroom hold {items} jars. How many jars are there altogether?",
        ],
        items=xs,
    )
    return text, sum(xs), f"print({' + '.join(map(str, xs))})"


def _remainder(rng, digits, varied=False):
    a, b = number(rng, (digits[0] + 1, digits[1] + 1)), max(2, number(rng, digits))
    text = _write(
        rng,
        varied,
        [
            "What is the remainder when {a} is divided by {b}?",
            "Find {a} mod {b}.",
            "{a} marbles are shared equally among {b} children, as many as possible each. How many marbles are left over?",
            "What is left over when {a} is split into groups of {b}?",
        ],
        a=a,
        b=b,
    )
    return text, a % b, f"print({a} % {b})"


def _quotient(rng, digits, varied=False):
    a, b = number(rng, (digits[0] + 1, digits[1] + 1)), max(2, number(rng, digits))
    text = _write(
        rng,
        varied,
        [
            "{a} eggs are packed in cartons of {b}. How many cartons are completely filled?",
            "How many full groups of {b} can be made from {a} chairs?",
            "A bus holds {b} people. How many buses can be filled completely with {a} people?",
            "What is the whole-number part of {a} divided by {b}?",
        ],
        a=a,
        b=b,
    )
    return text, a // b, f"print({a} // {b})"


def _two_step(rng, digits, varied=False):
    a, b, c = number(rng, digits), number(rng, digits), number(rng, digits)
    text = _write(
        rng,
        varied,
        [
            "Compute {a} times {b}, minus {c}.",
            "Multiply {a} by {b}, then subtract {c}.",
            "A cinema sold {a} seats at {b} dollars each and paid {c} dollars for cleaning. How many dollars remain?",
            "What do you get if you take {c} away from the product of {a} and {b}?",
        ],
        a=a,
        b=b,
        c=c,
    )
    return text, a * b - c, f"print({a} * {b} - {c})"


def _power_mod(rng, digits, varied=False):
    a, e, n = number(rng, digits), rng.randint(2, 9 + 3 * digits[1]), max(2, number(rng, digits))
    text = _write(
        rng,
        varied,
        [
            "What is {a} to the power {e}, modulo {n}?",
            "Find the remainder of {a}^{e} divided by {n}.",
            "What is {a}^{e} mod {n}?",
            "When {a} is raised to the power {e} and divided by {n}, what remainder is left?",
        ],
        a=a,
        e=e,
        n=n,
    )
    return text, pow(a, e, n), f"print(pow({a}, {e}, {n}))"


def _multiples(rng, digits, varied=False):
    n, k = number(rng, (digits[0] + 1, digits[1] + 1)), max(2, number(rng, (1, max(1, digits[1] - 1))))
    text = _write(
        rng,
        varied,
        [
            "How many numbers from 1 to {n} are multiples of {k}?",
            "How many positive integers up to {n} are divisible by {k}?",
            "Count the multiples of {k} between 1 and {n}.",
            "Among the whole numbers 1 through {n}, how many can be divided evenly by {k}?",
        ],
        n=n,
        k=k,
    )
    return text, n // k, f"print({n} // {k})"


def _choose(rng, digits, varied=False):
    n = rng.randint(5, 6 + 4 * digits[1])
    k = rng.randint(2, n // 2)
    text = _write(
        rng,
        varied,
        [
            "In how many ways can a team of {k} be chosen from {n} people?",
            "How many different groups of {k} can be picked from {n} students?",
            "A committee of {k} is formed from {n} candidates. How many committees are possible?",
            "Compute the binomial coefficient C({n}, {k}).",
        ],
        n=n,
        k=k,
    )
    return text, math.comb(n, k), f"import math\nprint(math.comb({n}, {k}))"


FAMILIES: dict[str, Callable[..., tuple[str, int, str]]] = {
    "product": _product,
    "sum": _sum,
    "remainder": _remainder,
    "quotient": _quotient,
    "two_step": _two_step,
    "power_mod": _power_mod,
    "multiples": _multiples,
    "choose": _choose,
}
WORDINGS = ("plain", "varied")


def is_heldout(problem: str) -> bool:
    h = int.from_bytes(hashlib.sha256(problem.encode()).digest()[:8], "big")
    return h / 2**64 < HELDOUT_SHARE


def generate(
    count: int,
    *,
    families: Sequence[str] | None = None,
    digits: tuple[int, int] = (1, 3),
    seed: int = 0,
    split: str = "train",
    wording: str = "plain",
) -> list[Task]:
    """``count`` distinct problems of one split, families in turn (equally present, except that a
    family with few distinct problems, like small binomials, gives way to the others).
    ``wording="varied"``: each family in several phrasings and contexts, large numbers now and
    then with thousands separators (the plain wording is one of them)."""
    names = list(families or FAMILIES)
    unknown = [f for f in names if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown task families {unknown}; known: {', '.join(FAMILIES)}")
    if wording not in WORDINGS:
        raise ValueError(f"wording must be one of {', '.join(WORDINGS)}, got {wording!r}")
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    lo, hi = digits
    if not 1 <= lo <= hi:
        raise ValueError(f"digits must be a range 1 <= lo <= hi, got {digits}")
    varied = wording == "varied"
    rng = random.Random(f"{seed}:{split}:{lo}-{hi}:{','.join(names)}" + (":varied" if varied else ""))
    out: list[Task] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < count:
        tries += 1
        if tries > 200 * count + 1000:
            raise ValueError(f"cannot find {count} distinct {split} problems with digits {digits}")
        family = names[tries % len(names)]
        text, answer, code = FAMILIES[family](rng, digits, varied)
        if text in seen or is_heldout(text) != (split == "heldout"):
            continue
        seen.add(text)
        out.append(Task(family, text, answer, code))
    return out

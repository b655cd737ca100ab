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


def _product(rng, digits):
    a, b = number(rng, digits), number(rng, digits)
    return (
        f"A shop has {a} boxes with {b} pens in each box. How many pens does it have?",
        a * b,
        f"print({a} * {b})",
    )


def _sum(rng, digits):
    xs = [number(rng, digits) for _ in range(rng.randint(3, 4))]
    return (
        f"What is the sum of {', '.join(map(str, xs[:-1]))} and {xs[-1]}?",
        sum(xs),
        f"print({' + '.join(map(str, xs))})",
    )


def _remainder(rng, digits):
    a, b = number(rng, (digits[0] + 1, digits[1] + 1)), max(2, number(rng, digits))
    return f"What is the remainder when {a} is divided by {b}?", a % b, f"print({a} % {b})"


def _quotient(rng, digits):
    a, b = number(rng, (digits[0] + 1, digits[1] + 1)), max(2, number(rng, digits))
    text = f"{a} eggs are packed in cartons of {b}. How many cartons are completely filled?"
    return text, a // b, f"print({a} // {b})"


def _two_step(rng, digits):
    a, b, c = number(rng, digits), number(rng, digits), number(rng, digits)
    return f"Compute {a} times {b}, minus {c}.", a * b - c, f"print({a} * {b} - {c})"


def _power_mod(rng, digits):
    a, e, n = number(rng, digits), rng.randint(2, 9 + 3 * digits[1]), max(2, number(rng, digits))
    return f"What is {a} to the power {e}, modulo {n}?", pow(a, e, n), f"print(pow({a}, {e}, {n}))"


def _multiples(rng, digits):
    n, k = number(rng, (digits[0] + 1, digits[1] + 1)), max(2, number(rng, (1, max(1, digits[1] - 1))))
    return f"How many numbers from 1 to {n} are multiples of {k}?", n // k, f"print({n} // {k})"


def _choose(rng, digits):
    n = rng.randint(5, 6 + 4 * digits[1])
    k = rng.randint(2, n // 2)
    text = f"In how many ways can a team of {k} be chosen from {n} people?"
    return text, math.comb(n, k), f"import math\nprint(math.comb({n}, {k}))"


FAMILIES: dict[str, Callable[[random.Random, tuple[int, int]], tuple[str, int, str]]] = {
    "product": _product,
    "sum": _sum,
    "remainder": _remainder,
    "quotient": _quotient,
    "two_step": _two_step,
    "power_mod": _power_mod,
    "multiples": _multiples,
    "choose": _choose,
}


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
) -> list[Task]:
    """``count`` distinct problems of one split, families in turn (equally present, except that a
    family with few distinct problems, like small binomials, gives way to the others)."""
    names = list(families or FAMILIES)
    unknown = [f for f in names if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown task families {unknown}; known: {', '.join(FAMILIES)}")
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    lo, hi = digits
    if not 1 <= lo <= hi:
        raise ValueError(f"digits must be a range 1 <= lo <= hi, got {digits}")
    rng = random.Random(f"{seed}:{split}:{lo}-{hi}:{','.join(names)}")
    out: list[Task] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < count:
        tries += 1
        if tries > 200 * count + 1000:
            raise ValueError(f"cannot find {count} distinct {split} problems with digits {digits}")
        family = names[tries % len(names)]
        text, answer, code = FAMILIES[family](rng, digits)
        if text in seen or is_heldout(text) != (split == "heldout"):
            continue
        seen.add(text)
        out.append(Task(family, text, answer, code))
    return out

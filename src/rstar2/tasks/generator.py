"""Synthetic problems with integer answers where the Python tool genuinely matters: a tiny model
cannot multiply 4-digit numbers in its head, but it can copy them into a one-line program. Held-out
problems are never training problems: a problem's split is fixed by a hash of its text, so sets of
different splits are disjoint whatever their seeds and sizes."""

from __future__ import annotations

import functools
import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from ..config import DEFAULT_RUN
from ..problems import DATA_DIR
from . import chains, relations
from .relations import Say

HELDOUT_SHARE = 0.1  # the share of all possible problems reserved for evaluation


@dataclass(frozen=True)
class Task:
    family: str
    problem: str
    answer: int
    code: str  # a program that prints the answer
    level: int | None = None  # its steps (relations.py, chains.py); None for the arithmetic families

    def row(self) -> dict:
        row = {"problem": self.problem, "answer": str(self.answer), "family": self.family}
        return row if self.level is None else {**row, "level": self.level}


def number(rng: random.Random, digits: tuple[int, int]) -> int:
    """An integer with a number of digits drawn uniformly from ``digits`` (inclusive)."""
    d = rng.randint(*digits)
    return rng.randint(10 ** (d - 1) if d > 1 else 1, 10**d - 1)


def _write(
    rng: random.Random, varied: bool, wordings: Sequence[str], values: dict[str, int | list[int]]
) -> str:
    """The first wording (the plain generator's), or (varied) any of them, with ``values`` written
    in: a list as "a, b and c", large numbers now and then with thousands separators."""
    text = rng.choice(wordings) if varied else wordings[0]

    def written(n: int) -> str:
        return f"{n:,}" if varied and n >= 1000 and rng.random() < 0.4 else str(n)

    def listed(xs: list[int]) -> str:
        return f"{', '.join(map(written, xs[:-1]))} and {written(xs[-1])}"

    return text.format(**{k: listed(v) if isinstance(v, list) else written(v) for k, v in values.items()})


# Each family draws its numbers and returns them (named as in its wordings), the answer and the
# program that prints it; the words are data (``data/wordings.yaml``).
Drawn = tuple[dict[str, Any], int, str]


def _product(rng: random.Random, digits: tuple[int, int]) -> Drawn:
    a, b = number(rng, digits), number(rng, digits)
    return {"a": a, "b": b}, a * b, f"print({a} * {b})"


def _sum(rng: random.Random, digits: tuple[int, int]) -> Drawn:
    xs = [number(rng, digits) for _ in range(rng.randint(3, 4))]
    return {"items": xs}, sum(xs), f"print({' + '.join(map(str, xs))})"


def _divide(rng: random.Random, digits: tuple[int, int], op: str) -> Drawn:
    """A number one digit longer than ``digits`` by another: its remainder (``%``) or quotient (``//``)."""
    a, b = number(rng, (digits[0] + 1, digits[1] + 1)), max(2, number(rng, digits))
    return {"a": a, "b": b}, a % b if op == "%" else a // b, f"print({a} {op} {b})"


def _two_step(rng: random.Random, digits: tuple[int, int]) -> Drawn:
    a, b, c = number(rng, digits), number(rng, digits), number(rng, digits)
    return {"a": a, "b": b, "c": c}, a * b - c, f"print({a} * {b} - {c})"


def _power_mod(rng: random.Random, digits: tuple[int, int]) -> Drawn:
    a, e, n = number(rng, digits), rng.randint(2, 9 + 3 * digits[1]), max(2, number(rng, digits))
    return {"a": a, "e": e, "n": n}, pow(a, e, n), f"print(pow({a}, {e}, {n}))"


def _multiples(rng: random.Random, digits: tuple[int, int]) -> Drawn:
    n, k = number(rng, (digits[0] + 1, digits[1] + 1)), max(2, number(rng, (1, max(1, digits[1] - 1))))
    return {"n": n, "k": k}, n // k, f"print({n} // {k})"


def _choose(rng: random.Random, digits: tuple[int, int]) -> Drawn:
    n = rng.randint(5, 6 + 4 * digits[1])
    k = rng.randint(2, n // 2)
    return {"n": n, "k": k}, math.comb(n, k), f"import math\nprint(math.comb({n}, {k}))"


FAMILIES: dict[str, Callable[[random.Random, tuple[int, int]], Drawn]] = {
    "product": _product,
    "sum": _sum,
    "remainder": functools.partial(_divide, op="%"),
    "quotient": functools.partial(_divide, op="//"),
    "two_step": _two_step,
    "power_mod": _power_mod,
    "multiples": _multiples,
    "choose": _choose,
}
WORDINGS = ("plain", "varied")
# The families with levels of steps (relations.py, chains.py), drawn only when named
LEVELED = {**dict.fromkeys(relations.FAMILIES, relations), **dict.fromkeys(chains.FAMILIES, chains)}
RELATION_FAMILIES = tuple(relations.FAMILIES)
ALL_FAMILIES = (*FAMILIES, *LEVELED)
GROUPS = {"arithmetic": tuple(FAMILIES), "relations": RELATION_FAMILIES, "chains": tuple(chains.FAMILIES)}
MAX_LEVEL = max(chains.LEVELS)


def check_ranges(digits: Sequence[int], levels: Sequence[int]) -> None:
    """A generator's ``digits`` and ``levels``: [lo, hi] ranges it can draw from."""
    if not 1 <= digits[0] <= digits[1]:
        raise ValueError(f"digits must be [lo, hi] with 1 <= lo <= hi, got {list(digits)}")
    if not 1 <= levels[0] <= levels[1] <= MAX_LEVEL:
        raise ValueError(f"levels must be [lo, hi] with 1 <= lo <= hi <= {MAX_LEVEL}, got {list(levels)}")


def level_range(family: str, levels: tuple[int, int]) -> tuple[int, int]:
    """A leveled family's share of a generator's ``levels``: the range cut at its own highest level."""
    top = max(LEVELED[family].LEVELS)
    return min(levels[0], top), min(levels[1], top)


def expand_families(names: Sequence[str] | None) -> list[str]:
    """Family names with the groups (``arithmetic``, ``relations``) spelled out; None: arithmetic."""
    out = list(dict.fromkeys(f for name in names or ["arithmetic"] for f in GROUPS.get(name, (name,))))
    unknown = [f for f in out if f not in ALL_FAMILIES]
    if unknown:
        raise ValueError(
            f"unknown task families {unknown}; known: {', '.join(ALL_FAMILIES)} (or the groups {', '.join(GROUPS)})"
        )
    return out


def cells(
    families: Sequence[str] | None, digits: tuple[int, int], levels: tuple[int, int]
) -> list[tuple[str, int]]:
    """The (family, level) cells of a generator: an arithmetic family's level is its numbers' digits,
    any other's its steps (the difficulty ladder probes each cell)."""
    ranges = {f: digits if f in FAMILIES else level_range(f, levels) for f in expand_families(families)}
    return [(f, n) for f, (lo, hi) in ranges.items() for n in range(lo, hi + 1)]


@functools.cache
def wordings() -> dict[str, list[str]]:
    """Each family's wordings (``data/wordings.yaml``), the plain one first."""
    return yaml.safe_load((DATA_DIR / "wordings.yaml").read_text())


def is_heldout(problem: str) -> bool:
    h = int.from_bytes(hashlib.sha256(problem.encode()).digest()[:8], "big")
    return h / 2**64 < HELDOUT_SHARE


def _weight(family: str, weights: dict[str, int]) -> int:
    """A family's turns in a generator's round: its own weight, else its group's, else 1."""
    group = next((g for g, members in GROUPS.items() if family in members and g in weights), None)
    return weights.get(family, weights.get(group, 1) if group else 1)


def generate(
    count: int,
    *,
    families: Sequence[str] | None = None,
    digits: tuple[int, int] = (1, 3),
    seed: int = DEFAULT_RUN.seed,
    split: str = "train",
    wording: str = "plain",
    levels: tuple[int, int] = (1, 3),
    weights: dict[str, int] | None = None,
) -> list[Task]:
    """``count`` distinct problems of one split, families in turn (one with few distinct problems,
    like small binomials, gives way to the others; ``weights``: a family's or group's turns in the
    round); the other settings are a recipe generator's (``GeneratorSpec``)."""
    names = expand_families(families)
    turns = [f for f in names for _ in range(_weight(f, weights or {}))]
    check_ranges(digits, levels)
    if wording not in WORDINGS:
        raise ValueError(f"wording must be one of {', '.join(WORDINGS)}, got {wording!r}")
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    lo, hi = digits
    varied = wording == "varied"
    key = f"{seed}:{split}:{lo}-{hi}:{','.join(names)}" + (":varied" if varied else "")
    if any(f in LEVELED for f in names):
        key += f":levels{levels[0]}-{levels[1]}"
    if turns != names:
        key += f":turns{','.join(turns)}"
    rng = random.Random(key)
    out: list[Task] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < count:
        tries += 1
        if tries > 200 * count + 1000:
            raise ValueError(f"cannot find {count} distinct {split} problems with digits {digits}")
        family = turns[tries % len(turns)]
        level = rng.randint(*level_range(family, levels)) if family in LEVELED else None
        if level is not None:
            text, answer, code = LEVELED[family].FAMILIES[family](rng, level, Say(rng, varied))
        else:
            values, answer, code = FAMILIES[family](rng, digits)
            text = _write(rng, varied, wordings()[family], values)
        if text in seen or is_heldout(text) != (split == "heldout"):
            continue
        seen.add(text)
        out.append(Task(family, text, answer, code, level))
    return out

"""Word problems phrased unlike ``tasks.py``: other wording, units and currencies, numbers with
thousands separators, and two-step questions. They test whether a model carries the tool habit
over to new wording (``rstar2 eval --bench paraphrased``). Every answer is computed here, and every
problem carries a program that computes it a second way (a test runs both).

``python -m rstar2.recipe.paraphrased`` rewrites the shipped set, ``data/paraphrased.jsonl``.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from pathlib import Path

from ..jsonl import write_jsonl

COUNT, SEED = 120, 2026


def _n(rng: random.Random, lo: int, hi: int) -> int:
    return rng.randint(lo, hi)


def _train(rng):
    v, h = _n(rng, 45, 180), _n(rng, 3, 14)
    return (
        f"A train keeps a steady {v} km/h for {h} hours. How far does it go, in kilometres?",
        v * h,
        f"print({v} * {h})",
    )


def _savings(rng):
    a, w, b = _n(rng, 12, 95), _n(rng, 8, 52), _n(rng, 100, 400)
    text = f"Maria puts aside ${a} every week. After {w} weeks she buys a bicycle for ${b}. How many dollars does she have left?"
    return text, a * w - b, f"print({a} * {w} - {b})"


def _field(rng):
    length, width = _n(rng, 120, 2400), _n(rng, 35, 900)
    text = f"A rectangular field is {length:,} m long and {width} m wide. What is its area in square metres?"
    return text, length * width, f"print({length} * {width})"


def _factory(rng):
    a, s, d = _n(rng, 140, 980), _n(rng, 2, 3), _n(rng, 5, 30)
    text = f"Each shift a factory turns out {a} bolts, and it runs {s} shifts a day. How many bolts after {d} days?"
    return text, a * s * d, f"print({a} * {s} * {d})"


def _bottles(rng):
    n, k = _n(rng, 1500, 40000), _n(rng, 3, 19)
    text = f"{n:,} litres of juice go into {k}-litre bottles. How many bottles are filled to the top?"
    return text, n // k, f"print({n} // {k})"


def _ribbon(rng):
    n, k = _n(rng, 500, 9000), _n(rng, 13, 97)
    text = f"A ribbon of {n:,} cm is cut into pieces of {k} cm each. How many centimetres are left over?"
    return text, n % k, f"print({n} % {k})"


def _tickets(rng):
    p, n, d = _n(rng, 7, 48), _n(rng, 25, 400), _n(rng, 20, 150)
    text = f"Tickets cost €{p} each. A school buys {n} of them and gets €{d} off the total. How many euros does it pay?"
    return text, p * n - d, f"print({p} * {n} - {d})"


def _town(rng):
    a, b, y = _n(rng, 12000, 95000), _n(rng, 150, 2400), _n(rng, 3, 25)
    text = (
        f"A town of {a:,} people grows by {b} residents a year. How many people live there after {y} years?"
    )
    return text, a + b * y, f"print({a} + {b} * {y})"


def _printer(rng):
    r, p = _n(rng, 12, 60), _n(rng, 700, 9000)
    text = f"A printer manages {r} pages per minute. How many whole minutes must it run to print {p:,} pages?"
    return text, math.ceil(p / r), f"print(-(-{p} // {r}))"


def _crates(rng):
    a, b, c = _n(rng, 12, 480), _n(rng, 12, 480), _n(rng, 12, 480)
    text = f"Three crates weigh {a} kg, {b} kg and {c} kg. What do they weigh together, in grams?"
    return text, (a + b + c) * 1000, f"print(({a} + {b} + {c}) * 1000)"


def _plan(rng):
    m, f, n = _n(rng, 15, 89), _n(rng, 20, 200), _n(rng, 6, 36)
    text = f"A phone plan is ${m} per month plus a ${f} sign-up fee. What does it cost over {n} months, in dollars?"
    return text, m * n + f, f"print({m} * {n} + {f})"


def _power(rng):
    e, n = _n(rng, 20, 90), _n(rng, 7, 97)
    text = f"Raise 3 to the {e}th power and divide by {n}. What remainder is left?"
    return text, pow(3, e, n), f"print(pow(3, {e}, {n}))"


def _officers(rng):
    n = _n(rng, 12, 140)
    text = f"A club has {n} members. In how many ways can it pick a president and a different treasurer?"
    return text, n * (n - 1), f"print({n} * ({n} - 1))"


def _evens(rng):
    a, b = _n(rng, 100, 3000), _n(rng, 5000, 90000)
    text = f"How many even whole numbers lie between {a:,} and {b:,}, counting both ends?"
    return text, b // 2 - (a - 1) // 2, f"print(len(range({a + a % 2}, {b} + 1, 2)))"


def _tank(rng):
    h, leak = _n(rng, 3, 24), _n(rng, 15, 90)
    c = h * leak + _n(rng, 100, 5000)
    text = f"A tank holds {c:,} litres and loses {leak} litres every hour. How much water is left after {h} hours, in litres?"
    return text, c - leak * h, f"print({c} - {leak} * {h})"


def _average(rng):
    xs = [_n(rng, 40, 990) for _ in range(4)]
    xs[-1] += (-sum(xs)) % 4  # a whole-number mean
    text = f"The four readings are {xs[0]}, {xs[1]}, {xs[2]} and {xs[3]} grams. What is their mean, in grams?"
    return text, sum(xs) // 4, f"print(({' + '.join(map(str, xs))}) // 4)"


TEMPLATES: dict[str, Callable[[random.Random], tuple[str, int, str]]] = {
    "train": _train,
    "savings": _savings,
    "field": _field,
    "factory": _factory,
    "bottles": _bottles,
    "ribbon": _ribbon,
    "tickets": _tickets,
    "town": _town,
    "printer": _printer,
    "crates": _crates,
    "plan": _plan,
    "power": _power,
    "officers": _officers,
    "evens": _evens,
    "tank": _tank,
    "average": _average,
}


def generate(count: int = COUNT, seed: int = SEED) -> list[dict]:
    """``count`` distinct problems, templates in turn: ``problem``, ``answer``, ``kind``, ``code``."""
    rng = random.Random(seed)
    names, rows, seen = list(TEMPLATES), [], set()
    while len(rows) < count:
        kind = names[len(rows) % len(names)]
        text, answer, code = TEMPLATES[kind](rng)
        if text in seen:
            continue
        seen.add(text)
        rows.append(
            {
                "id": f"para-{len(rows):03d}",
                "problem": text,
                "answer": str(answer),
                "kind": kind,
                "code": code,
            }
        )
    return rows


def main(out: str | Path) -> None:
    write_jsonl(generate(), out)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1] / "data" / "paraphrased.jsonl")

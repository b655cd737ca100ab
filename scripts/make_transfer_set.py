"""The generator of the `transfer` set (``src/rstar2/data/transfer.jsonl``): word problems no
training generator writes, to measure whether the tool habit (read the relations, write the program,
check, answer) carries past the training problems.

Written apart from the training families of ``tasks/relations.py`` and kept out of the package, so
no training code can draw on it (a test checks that no wording or number pattern of this set occurs
in the training data). Its twelve situations (recipes scaled, durations on a clock, fence posts,
stock over weeks, tiered prices, savings goals, fuel, tables for guests, "times as many", a missing
score, discount then change, buses for classes) each come in a few wordings with one, two or three
steps, a third of them with a number that must be ignored, small numbers now and then in words.
Answers are computed here, each row with the program that computes it again.

``python scripts/make_transfer_set.py [PATH]`` writes the set; a test checks the shipped file is
exactly this script's output.
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path

COUNT_PER_SITUATION = 8
SEED = 20261125

_SMALL = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
).split()


def spoken(n: int, rng: random.Random) -> str:
    """``n`` in words now and then (small numbers only), else in digits."""
    return _SMALL[n] if n <= 20 and rng.random() < 0.5 else str(n)


Made = tuple[str, int, str]  # problem, answer, program


def _recipe(rng: random.Random) -> Made:
    serves, scale = rng.choice([2, 4, 5, 6]), rng.randint(2, 7)
    grams = rng.randint(3, 40) * 10
    guests = serves * scale
    noise = rng.randint(15, 60)
    text = rng.choice(
        [
            f"My soup recipe feeds {spoken(serves, rng)} and calls for {grams} g of lentils. "
            f"I am cooking for {guests}. How many grams of lentils do I need?",
            f"To serve {spoken(serves, rng)} diners, a chef uses {grams} grams of rice; the dish simmers "
            f"for {noise} minutes. How much rice, in grams, for {guests} diners?",
        ]
    )
    code = f"grams_per_person = {grams} / {serves}\nprint(round(grams_per_person * {guests}))"
    return text, grams * scale, code


def _clock(rng: random.Random) -> Made:
    h1, m1 = rng.randint(6, 13), rng.choice(range(0, 60, 5))
    span = rng.randint(35, 230)
    end = h1 * 60 + m1 + span
    h2, m2 = divmod(end, 60)
    text = rng.choice(
        [
            f"The rehearsal began at {h1}:{m1:02d} and finished at {h2}:{m2:02d}. "
            "For how many minutes did it run?",
            f"Doors opened at {h1}:{m1:02d}. The last visitor left at {h2}:{m2:02d} the same day. "
            "How many minutes were the doors open?",
        ]
    )
    code = f"print(({h2} * 60 + {m2}) - ({h1} * 60 + {m1}))"
    return text, span, code


def _posts(rng: random.Random) -> Made:
    gap = rng.choice([2, 3, 4, 5])
    w, d = gap * rng.randint(4, 30), gap * rng.randint(3, 20)
    answer = 2 * (w + d) // gap
    text = rng.choice(
        [
            f"A paddock measures {w} m by {d} m. A fence goes all the way round with a post every "
            f"{gap} m. How many posts are there?",
            f"Around a {w}-metre by {d}-metre playground, lamps stand {spoken(gap, rng)} metres apart along "
            "the whole edge, one at each corner. How many lamps?",
        ]
    )
    return text, answer, f"perimeter = 2 * ({w} + {d})\nprint(perimeter // {gap})"


def _stock(rng: random.Random) -> Made:
    start, come, go = rng.randint(200, 2000), rng.randint(20, 150), rng.randint(10, 140)
    weeks = rng.randint(2, 9)
    answer = start + weeks * (come - go)
    if answer < 0:
        return _stock(rng)
    text = rng.choice(
        [
            f"A depot holds {start} tyres. Each week {come} more are delivered and {go} are fitted to cars. "
            f"How many tyres are in the depot after {spoken(weeks, rng)} weeks?",
            f"On Monday the pantry had {start} tins. Every week after that, volunteers brought {come} tins "
            f"and families took {go}. How many tins were there {weeks} weeks later?",
        ]
    )
    return text, answer, f"print({start} + {weeks} * ({come} - {go}))"


def _tiered(rng: random.Random) -> Made:
    first, extra, hours = rng.randint(3, 12), rng.randint(2, 6), rng.randint(2, 11)
    answer = first + extra * (hours - 1)
    text = rng.choice(
        [
            f"Parking is ${first} for the first hour and ${extra} for every hour after that. "
            f"What does it cost to park for {spoken(hours, rng)} hours?",
            f"A kayak rents for {first} euros for the first hour, then {extra} euros per additional hour. "
            f"Jo keeps it {hours} hours. How many euros does Jo pay?",
        ]
    )
    return text, answer, f"print({first} + {extra} * ({hours} - 1))"


def _goal(rng: random.Random) -> Made:
    price, have, weekly = rng.randint(120, 900), rng.randint(10, 100), rng.randint(15, 60)
    if have >= price:
        return _goal(rng)
    answer = math.ceil((price - have) / weekly)
    text = rng.choice(
        [
            f"Lena wants a guitar that costs ${price}. She has ${have} and saves ${weekly} each week. "
            "How many weeks until she can afford it?",
            f"A club needs {price} pounds for a trip. It already has {have} pounds and raises {weekly} pounds "
            "a week. After how many weeks does it first have enough?",
        ]
    )
    return text, answer, f"import math\nprint(math.ceil(({price} - {have}) / {weekly}))"


def _fuel(rng: random.Random) -> Made:
    per100, hundreds = rng.randint(4, 12), rng.randint(2, 15)
    km = 100 * hundreds
    passengers = rng.randint(2, 5)
    answer = per100 * hundreds
    text = rng.choice(
        [
            f"A van burns {per100} litres of diesel per 100 km. How many litres does a {km} km journey take?",
            f"With {spoken(passengers, rng)} people on board, a car drives {km} km. It uses {per100} L of "
            "petrol for every 100 km. How many litres of petrol does the drive use?",
        ]
    )
    return text, answer, f"print({per100} * {km} // 100)"


def _tables(rng: random.Random) -> Made:
    seats, guests = rng.randint(4, 12), rng.randint(30, 400)
    answer = -(-guests // seats)
    text = rng.choice(
        [
            f"Each table at the wedding seats {spoken(seats, rng)}. There are {guests} guests. "
            "What is the smallest number of tables needed?",
            f"A ferry crossing takes {seats} cars per trip. {guests} cars are waiting. "
            "How many trips must the ferry make to carry them all?",
        ]
    )
    return text, answer, f"print(-(-{guests} // {seats}))"


def _times(rng: random.Random) -> Made:
    base, k = rng.randint(12, 250), rng.randint(2, 6)
    answer = base * k - base
    text = rng.choice(
        [
            f"Ben read {base} pages this month. Anna read {spoken(k, rng)} times as many. "
            "How many more pages did Anna read than Ben?",
            f"The red team scored {k} times the blue team's {base} points. By how many points did the red "
            "team win?",
        ]
    )
    return text, answer, f"anna = {base} * {k}\nprint(anna - {base})"


def _missing(rng: random.Random) -> Made:
    n = rng.randint(3, 5)
    scores = [rng.randint(55, 99) for _ in range(n - 1)]
    mean = rng.randint(60, 95)
    last = mean * n - sum(scores)
    if not 0 <= last <= 100:
        return _missing(rng)
    listed = ", ".join(map(str, scores[:-1])) + f" and {scores[-1]}"
    text = rng.choice(
        [
            f"Over {spoken(n, rng)} quizzes Tom averaged exactly {mean}. His first scores were {listed}. "
            "What did he get on the last quiz?",
            f"The mean of {n} parcels' weights is {mean} kg. All but one weigh {listed} kg. "
            "How heavy is the remaining parcel, in kg?",
        ]
    )
    return text, last, f"print({mean} * {n} - ({' + '.join(map(str, scores))}))"


def _discount(rng: random.Random) -> Made:
    off = rng.choice([10, 20, 25, 50])
    price = rng.randint(2, 30) * (100 // math.gcd(100, off))
    paid = price - price * off // 100
    note = next(n for n in (20, 50, 100, 200, 500, 1000, 5000) if n >= paid)
    text = rng.choice(
        [
            f"A jacket is priced at ${price}, and today everything is {off}% off. Sam pays with a ${note} "
            "bill. How much change does Sam get?",
            f"Headphones normally cost {price} dollars. In the sale they are {off} percent cheaper. "
            f"Paying with {note} dollars, what change comes back?",
        ]
    )
    return text, note - paid, f"paid = {price} - {price} * {off} // 100\nprint({note} - paid)"


def _buses(rng: random.Random) -> Made:
    a, sa, b, sb = rng.randint(2, 8), rng.randint(18, 32), rng.randint(1, 6), rng.randint(18, 32)
    cap, teachers = rng.choice([30, 40, 45, 50, 52]), rng.randint(2, 9)
    pupils = a * sa + b * sb
    answer = -(-pupils // cap)
    text = rng.choice(
        [
            f"A school has {spoken(a, rng)} classes of {sa} pupils and {b} classes of {sb} pupils. "
            f"Coaches hold {cap} pupils each. How many coaches carry all the pupils?",
            f"{a} groups of {sa} scouts and {b} groups of {sb} scouts go camping with {teachers} leaders, "
            f"who drive themselves. Minibuses take {cap} scouts each. How many minibuses do the scouts need?",
        ]
    )
    return text, answer, f"pupils = {a} * {sa} + {b} * {sb}\nprint(-(-pupils // {cap}))"


SITUATIONS: dict[str, Callable[[random.Random], Made]] = {
    "recipe": _recipe,
    "clock": _clock,
    "posts": _posts,
    "stock": _stock,
    "tiered": _tiered,
    "goal": _goal,
    "fuel": _fuel,
    "tables": _tables,
    "times": _times,
    "missing": _missing,
    "discount": _discount,
    "buses": _buses,
}


def build(count_per_situation: int = COUNT_PER_SITUATION, seed: int = SEED) -> list[dict]:
    """The set's rows, situations interleaved, each with its ``code``."""
    rng = random.Random(seed)
    rows: list[dict] = []
    seen: set[str] = set()
    for _ in range(count_per_situation):
        for kind, make in SITUATIONS.items():
            while True:
                text, answer, code = make(rng)
                if text not in seen:
                    break
            seen.add(text)
            rows.append(
                {
                    "id": f"transfer-{len(rows):03d}",
                    "problem": text,
                    "answer": str(answer),
                    "kind": kind,
                    "code": code,
                }
            )
    return rows


def main(path: str | None = None) -> None:
    target = Path(path) if path else Path(__file__).parents[1] / "src" / "rstar2" / "data" / "transfer.jsonl"
    target.write_text("".join(json.dumps(r) + "\n" for r in build()))
    print(f"wrote {target}")


if __name__ == "__main__":
    main(*sys.argv[1:])

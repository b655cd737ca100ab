"""Word problems that teach relations, not phrasings (the arithmetic families teach a model to copy
numbers under the operation the wording names): a small situation told one fact a sentence, each in
several ways, any quantity asked; level 1 is one relation, 2 two, 3 three with a number to ignore.
The sentences are built with the structure they state, so they live here, not in ``wordings.yaml``."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

LEVELS = (1, 2, 3)

# The numbers a varied problem may write in words.
_WORDS = dict(enumerate("zero one two three four five six seven eight nine ten eleven twelve".split()))
_WORDS |= dict(enumerate("thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty".split(), 13))
_WORDS |= {30: "thirty", 40: "forty", 50: "fifty", 60: "sixty", 70: "seventy", 80: "eighty", 90: "ninety"}

PEOPLE = "Priya Marco Yuki Nadia Felix Amara Diego Hana Kofi Elsa Ravi Ines".split()


@dataclass
class Say:
    """How one problem is written: ``varied`` draws any phrasing and now and then a number in words
    (plain: the first phrasing, digits only)."""

    rng: random.Random
    varied: bool

    def n(self, x: int) -> str:
        in_words = self.varied and self.rng.random() < 0.3
        return _WORDS.get(x, str(x)) if in_words else str(x)

    def one(self, *options: str) -> str:
        return self.rng.choice(options) if self.varied else options[0]

    def who(self) -> str:
        return self.rng.choice(PEOPLE)


def _distractor(say: Say) -> str:
    """A sentence with a number the answer does not use (level 3)."""
    r = say.rng
    return " " + say.one(
        f"The place opened {say.n(r.randint(3, 40))} years ago.",
        f"It is {say.n(r.randint(2, 9))} km from the station.",
        f"{say.who()} has {say.n(r.randint(2, 12))} cousins.",
        f"The building has {say.n(r.randint(2, 30))} floors.",
        f"Last year the price of tea rose by {r.randint(2, 9)} cents.",
    )


Made = tuple[str, int, str]  # problem, answer, program

_RATE_ACTORS = [
    ("a printer", "pages", "minute"),
    ("a pump", "litres", "minute"),
    ("a baker", "rolls", "hour"),
    ("a machine", "bottles", "hour"),
    ("a cyclist", "kilometres", "hour"),
    ("an oven", "loaves", "hour"),
]


def _rate(rng: random.Random, level: int, say: Say) -> Made:
    actor, unit, per = rng.choice(_RATE_ACTORS)
    r, t = rng.randint(12, 400), rng.randint(3, 24)
    Actor = actor[0].upper() + actor[1:]
    fact = say.one(
        f"{Actor} makes {say.n(r)} {unit} every {per}.",
        f"Every {per}, {actor} turns out {say.n(r)} {unit}.",
        f"{Actor} works at a steady {say.n(r)} {unit} per {per}.",
    )
    if level == 1:
        ask = rng.choice(["total", "rate", "time"])
        if ask == "total":
            q = say.one(
                f"How many {unit} after {say.n(t)} {per}s?",
                f"How many {unit} does it give in {say.n(t)} {per}s?",
            )
            return f"{fact} {q}", r * t, f"rate = {r}\n{per}s = {t}\nprint(rate * {per}s)"
        total = r * t
        if ask == "rate":
            text = say.one(
                f"{Actor} made {total} {unit} in {say.n(t)} {per}s at a steady pace. How many {unit} per {per}?",
                f"In {say.n(t)} {per}s, {actor} produced {total} {unit}, the same each {per}. How many {unit} in one {per}?",
            )
            return text, r, f"total = {total}\n{per}s = {t}\nprint(total // {per}s)"
        text = say.one(
            f"{fact} How many {per}s does it need for {total} {unit}?",
            f"{fact} After how many {per}s has it made {total} {unit}?",
        )
        return text, t, f"total = {total}\nrate = {r}\nprint(total // rate)"
    d = rng.randint(2, 9)
    if level == 2:
        if rng.random() < 0.5:
            r2 = rng.randint(12, 400)
            text = f"{fact} " + say.one(
                f"A second one makes {say.n(r2)} {unit} per {per}. Working together, how many {unit} do they make in {say.n(t)} {per}s?",
                f"Another, slower or faster, gives {say.n(r2)} {unit} a {per}. How many {unit} do both give in {say.n(t)} {per}s?",
            )
            return text, (r + r2) * t, f"together = {r} + {r2}\nprint(together * {t})"
        text = f"{fact} " + say.one(
            f"It runs {say.n(t)} {per}s a day. How many {unit} in {say.n(d)} days?",
            f"It is used {say.n(t)} {per}s each day for {say.n(d)} days. How many {unit} in all?",
        )
        return text, r * t * d, f"per_day = {r} * {t}\nprint(per_day * {d})"
    bad = rng.randint(5, r * t // 2)
    text = (
        f"{fact} "
        + say.one(
            f"It runs {say.n(t)} {per}s a day for {say.n(d)} days, and {bad} of the {unit} are spoiled.",
            f"Over {say.n(d)} days it runs {say.n(t)} {per}s each day; {bad} {unit} have to be thrown away.",
        )
        + _distractor(say)
        + say.one(f" How many good {unit} are left?", f" How many {unit} can be kept?")
    )
    return text, r * t * d - bad, f"made = {r} * {t} * {d}\nspoiled = {bad}\nprint(made - spoiled)"


_GROUPS = [
    ("seats in a theatre", "are sold", "unsold"),
    ("apples in a crate", "are bruised", "fine"),
    ("students in a school", "walk to school", "not walking"),
    ("tickets in a raffle", "are bought", "not bought"),
    ("plants in a nursery", "are flowering", "not flowering"),
]


def _percent(rng: random.Random, level: int, say: Say) -> Made:
    things, have, rest = rng.choice(_GROUPS)
    p = rng.choice([10, 20, 25, 30, 40, 50, 60, 75, 80])
    step = 100 // math.gcd(100, p)
    if level == 3:
        q = rng.choice([10, 20, 25, 50])
        step = step * (100 // math.gcd(100, q))
    n = step * rng.randint(max(1, 40 // step), max(2, 4000 // step))
    part = n * p // 100
    fact = say.one(
        f"There are {n} {things}, and {p}% of them {have}.",
        f"Of the {n} {things}, {p} percent {have}.",
        f"{p}% of {n} {things} {have}.",
    )
    if level == 1:
        if rng.random() < 0.5:
            q1 = say.one("How many is that?", f"How many of them {have}?")
            return f"{fact} {q1}", part, f"n = {n}\nprint(n * {p} // 100)"
        q1 = say.one(f"How many are {rest}?", f"How many of the {things.split(' ')[0]} are {rest}?")
        return f"{fact} {q1}", n - part, f"n = {n}\npart = n * {p} // 100\nprint(n - part)"
    if level == 2:
        g = rng.randint(1, max(1, (n - part) // 2))
        text = f"{fact} " + say.one(
            f"Then {say.n(g)} more {have}. How many are still {rest}?",
            f"Later another {say.n(g)} {have}. How many remain {rest}?",
        )
        return text, n - part - g, f"n = {n}\npart = n * {p} // 100\nprint(n - part - {g})"
    remaining = n - part
    second = remaining * q // 100
    text = (
        f"{fact} "
        + say.one(
            f"Of the rest, {q}% are given away.",
            f"Then {q} percent of the remaining ones are given away.",
        )
        + _distractor(say)
        + say.one(" How many are left?", " How many remain after that?")
    )
    code = f"n = {n}\nrest = n - n * {p} // 100\ngiven = rest * {q} // 100\nprint(rest - given)"
    return text, remaining - second, code


_STOCKS = [
    ("a shelf", "books"),
    ("a jar", "marbles"),
    ("a barn", "bales"),
    ("a shop", "kites"),
    ("a pond", "fish"),
]


def _change(rng: random.Random, level: int, say: Say) -> Made:
    place, things = rng.choice(_STOCKS)
    a = rng.randint(50, 3000)
    b, c = rng.randint(5, a // 2), rng.randint(5, 900)
    who = say.who()
    start = say.one(
        f"{place[0].upper() + place[1:]} holds {say.n(a)} {things}.", f"{who} has {say.n(a)} {things}."
    )
    take = say.one(
        f"{say.n(b)} are taken away.",
        f"{who} gives away {say.n(b)} of them.",
        f"Then {say.n(b)} are removed.",
    )
    add = say.one(
        f"Later {say.n(c)} more arrive.",
        f"{who} then gets {say.n(c)} more.",
        f"{say.n(c)} new ones are added.",
    )
    if level == 1:
        if rng.random() < 0.5:
            text = f"{start} {take} How many {things} are there now?"
            return text, a - b, f"start = {a}\nprint(start - {b})"
        text = say.one(
            f"After {b} {things} were taken away, {say.n(a - b)} were left. How many were there at first?",
            f"{who} gave away {b} {things} and kept {say.n(a - b)}. How many did {who} have before?",
        )
        return text, a, f"left = {a - b}\ngiven = {b}\nprint(left + given)"
    if level == 2:
        if rng.random() < 0.5:
            text = f"{start} {take} {add} How many {things} are there now?"
            return text, a - b + c, f"print({a} - {b} + {c})"
        text = say.one(
            f"{who} gave away {b} {things}, then got {c} more, and now has {a - b + c}. How many did {who} start with?",
            f"After losing {b} {things} and gaining {c}, a collection has {a - b + c}. How many were in it at the start?",
        )
        return text, a, f"now = {a - b + c}\nprint(now + {b} - {c})"
    d = rng.randint(5, max(6, (a - b + c) // 2))
    text = (
        f"{start} {take} {add}"
        + _distractor(say)
        + say.one(
            f" Then {d} are sold. How many {things} remain?",
            f" Finally {d} more leave. How many {things} are there in the end?",
        )
    )
    return text, a - b + c - d, f"print({a} - {b} + {c} - {d})"


_UNITS = [
    ("kilometres", "metres", 1000),
    ("hours", "minutes", 60),
    ("kilograms", "grams", 1000),
    ("weeks", "days", 7),
    ("metres", "centimetres", 100),
    ("litres", "millilitres", 1000),
    ("minutes", "seconds", 60),
]


def _units(rng: random.Random, level: int, say: Say) -> Made:
    big, small, f = rng.choice(_UNITS)
    x = rng.randint(2, 90)
    if level == 1:
        if rng.random() < 0.5:
            text = say.one(
                f"How many {small} are in {say.n(x)} {big}?", f"Write {say.n(x)} {big} in {small}."
            )
            return text, x * f, f"print({x} * {f})"
        text = say.one(f"How many {big} make {x * f} {small}?", f"Convert {x * f} {small} to {big}.")
        return text, x, f"print({x * f} // {f})"
    y = rng.randint(1, f - 1)
    if level == 2:
        if rng.random() < 0.5:
            text = say.one(
                f"A trip takes {say.n(x)} {big} and {y} {small}. How long is it in {small}?",
                f"What is {say.n(x)} {big} plus {y} {small}, in {small}?",
            )
            return text, x * f + y, f"print({x} * {f} + {y})"
        k = rng.randint(2, 9)
        text = say.one(
            f"What is {say.n(k)} times {x} {big}, in {small}?",
            f"There are {say.n(k)} equal parts of {x} {big} each. How many {small} is that altogether?",
        )
        return text, k * x * f, f"each = {x} * {f}\nprint({k} * each)"
    x2, y2 = rng.randint(1, 40), rng.randint(1, f - 1)
    text = (
        say.one(
            f"One part is {say.n(x)} {big} {y} {small}, another is {say.n(x2)} {big} {y2} {small}.",
            f"The first piece measures {x} {big} and {y} {small}; the second {x2} {big} and {y2} {small}.",
        )
        + _distractor(say)
        + say.one(
            f" By how many {small} does the first exceed the second?", f" What is the difference in {small}?"
        )
    )
    first, second = x * f + y, x2 * f + y2
    if first < second:
        return _units(rng, level, say)
    return text, first - second, f"first = {x} * {f} + {y}\nsecond = {x2} * {f} + {y2}\nprint(first - second)"


_SHARES = [
    ("stickers", "children"),
    ("sweets", "friends"),
    ("cards", "players"),
    ("pencils", "pupils"),
    ("coins", "pirates"),
]


def _sharing(rng: random.Random, level: int, say: Say) -> Made:
    things, people = rng.choice(_SHARES)
    k = rng.randint(3, 24)
    n = rng.randint(30, 3000)
    ask = rng.choice(["each", "left", "groups"])
    if level == 1:
        if ask == "each":
            n = k * (n // k)
            text = say.one(
                f"{n} {things} are shared equally among {say.n(k)} {people}. How many does each get?",
                f"{say.n(k)} {people} split {n} {things} evenly. How many {things} per person?",
            )
            return text, n // k, f"print({n} // {k})"
        if ask == "left":
            text = say.one(
                f"{n} {things} are dealt out to {say.n(k)} {people}, the same number each and as many as possible. How many {things} are not dealt?",
                f"{say.n(k)} {people} share {n} {things} fairly; whatever cannot be shared stays in the box. How many stay in the box?",
            )
            return text, n % k, f"print({n} % {k})"
        text = say.one(
            f"{n} {things} are packed in bags of {say.n(k)}. How many bags are needed for all of them?",
            f"A box holds {say.n(k)} {things}. How many boxes does it take to hold {n} {things}?",
        )
        return text, -(-n // k), f"import math\nprint(math.ceil({n} / {k}))"
    packs, size = rng.randint(2, 30), rng.randint(6, 60)
    total = packs * size
    g = rng.randint(1, total // 3)
    if level == 2:
        if ask == "left":
            text = say.one(
                f"There are {say.n(packs)} packs of {size} {things}. They are shared among {say.n(k)} {people}, equally and as many as possible. How many are left over?",
                f"{say.n(packs)} packs hold {size} {things} each; {say.n(k)} {people} take equal shares, as many as they can. How many remain?",
            )
            return text, total % k, f"total = {packs} * {size}\nprint(total % {k})"
        text = say.one(
            f"{say.who()} keeps {g} of {total} {things} and shares the rest among {say.n(k)} {people}, as many as possible each. How many does each get?",
            f"From {total} {things}, {g} are set aside; the others go equally to {say.n(k)} {people}, whole ones only. How many does each receive?",
        )
        return text, (total - g) // k, f"rest = {total} - {g}\nprint(rest // {k})"
    text = (
        say.one(
            f"There are {say.n(packs)} packs of {size} {things}, and {g} are lost.",
            f"{say.n(packs)} packs of {size} {things} arrive, but {g} of them are damaged and removed.",
        )
        + _distractor(say)
        + say.one(
            f" The rest are shared among {say.n(k)} {people}, equally and as many as possible. How many are left over?",
            f" The remaining ones go to {say.n(k)} {people} in equal whole shares. How many cannot be given out?",
        )
    )
    return text, (total - g) % k, f"rest = {packs} * {size} - {g}\nprint(rest % {k})"


def _ages(rng: random.Random, level: int, say: Say) -> Made:
    a, b, c = rng.sample(PEOPLE, 3)
    yb, d, n = rng.randint(3, 40), rng.randint(2, 30), rng.randint(2, 20)
    older = say.one(f"{a} is {say.n(d)} years older than {b}.", f"{b} is {say.n(d)} years younger than {a}.")
    if level == 1:
        if rng.random() < 0.5:
            return f"{older} {b} is {say.n(yb)}. How old is {a}?", yb + d, f"print({yb} + {d})"
        return f"{older} {a} is {yb + d}. How old is {b}?", yb, f"print({yb + d} - {d})"
    if level == 2:
        m = rng.randint(2, 4)
        if rng.random() < 0.5:
            text = say.one(
                f"{a} is {say.n(m)} times as old as {b}, who is {say.n(yb)}. How old will {a} be in {say.n(n)} years?",
                f"{b} is {yb}. {a}'s age is {m} times {b}'s. What will {a}'s age be {n} years from now?",
            )
            return text, m * yb + n, f"age_a = {m} * {yb}\nprint(age_a + {n})"
        text = f"{older} {b} is {say.n(yb)}. What is the sum of their ages?"
        return text, 2 * yb + d, f"age_a = {yb} + {d}\nprint(age_a + {yb})"
    m = rng.randint(2, 3)
    yb = rng.randint(n + 1, 40)
    text = (
        f"{a} is {say.n(m)} times as old as {b}. {c} is {say.n(d)} years older than {a}. {b} is {yb}."
        + _distractor(say)
        + say.one(f" How old was {c} {say.n(n)} years ago?", f" What was {c}'s age {n} years ago?")
    )
    return text, m * yb + d - n, f"age_a = {m} * {yb}\nage_c = age_a + {d}\nprint(age_c - {n})"


_GOODS = [
    ("notebooks", "notebook"),
    ("pies", "pie"),
    ("tickets", "ticket"),
    ("lamps", "lamp"),
    ("shirts", "shirt"),
]
_NOTES = (5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


def _money(rng: random.Random, level: int, say: Say) -> Made:
    (goods, good), (goods2, good2) = rng.sample(_GOODS, 2)
    p, q = rng.randint(2, 90), rng.randint(2, 30)
    who = say.who()
    if level == 1:
        ask = rng.choice(["cost", "change", "afford"])
        if ask == "cost":
            text = say.one(
                f"A {good} costs ${p}. What do {say.n(q)} {goods} cost?",
                f"{who} buys {say.n(q)} {goods} at ${p} each. How many dollars is that?",
            )
            return text, p * q, f"print({q} * {p})"
        if ask == "change":
            note = next(x for x in _NOTES if x > p)
            text = say.one(
                f"{who} buys a {good} for ${p} and pays with a ${note} note. How much change?",
                f"A {good} is ${p}. {who} hands over ${note}. What change is given?",
            )
            return text, note - p, f"print({note} - {p})"
        budget = rng.randint(p, 40 * p)
        text = say.one(
            f"{goods[0].upper() + goods[1:]} cost ${p} each. How many can {who} buy with ${budget}?",
            f"With ${budget}, how many ${p} {goods} can be bought?",
        )
        return text, budget // p, f"print({budget} // {p})"
    cost = p * q
    if level == 2:
        note = next(x for x in _NOTES if x > cost)
        text = say.one(
            f"{who} buys {say.n(q)} {goods} at ${p} each and pays with ${note}. How much change does {who} get?",
            f"{say.n(q)} {goods} cost ${p} apiece. Paying with a ${note} note, what change comes?",
        )
        return text, note - cost, f"cost = {q} * {p}\nprint({note} - cost)"
    p2, q2 = rng.randint(2, 90), rng.randint(2, 20)
    cost += p2 * q2
    note = next(x for x in _NOTES if x > cost)
    text = (
        f"{who} buys {say.n(q)} {goods} at ${p} each and {say.n(q2)} {goods2} at ${p2} each."
        + _distractor(say)
        + say.one(
            f" {who} pays with ${note}. How much change is there?",
            f" Paying with a ${note} note, what change does {who} get?",
        )
    )
    return text, note - cost, f"cost = {q} * {p} + {q2} * {p2}\nprint({note} - cost)"


FAMILIES: dict[str, Callable[[random.Random, int, Say], Made]] = {
    "rate": _rate,
    "percent": _percent,
    "change": _change,
    "units": _units,
    "sharing": _sharing,
    "ages": _ages,
    "money": _money,
}

"""Word problems of several steps: a story of people and their things told one fact a sentence,
whose answer needs every fact; its program names one quantity per fact, the habit a model needs to
turn a situation into code. ``chain`` runs forwards (amounts compared and changed, then any amount,
a total or a difference asked), ``undo`` backwards (the changes and the end told, the start asked).
The level is the number of relations (1 to 6); from 3 on, a number to ignore may stand among them."""

from __future__ import annotations

import operator
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from .relations import PEOPLE, Say

LEVELS = (1, 2, 3, 4, 5, 6)
ITEMS = "stickers marbles stamps shells cards coins beads pencils buttons acorns".split()
_IDENT = {name: name.lower() for name in PEOPLE}
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv}


@dataclass
class _Story:
    """What has been told so far: each person's amount, the sentences and the program's lines."""

    say: Say
    item: str
    amounts: dict[str, int] = field(default_factory=dict)
    uses: dict[str, set[int]] = field(default_factory=dict)  # the facts each amount depends on
    sentences: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def start(self, sentence: str, name: str, amount: int) -> None:
        """The first fact: ``name`` has ``amount``."""
        self.uses[name] = {len(self.sentences)}
        self.sentences.append(sentence)
        self.amounts[name] = amount
        self.lines.append(f"{_IDENT[name]} = {amount}")

    def tell(
        self, sentence: str | None, name: str, base: str, op: str, operand: int, written: str = ""
    ) -> None:
        """A fact: ``name``'s amount is now ``base``'s ``op`` ``operand`` (``written`` in the program,
        default the operand); the one value and the program's line both come from it. ``sentence``
        None: a second amount the last sentence changed (a gift's receiver)."""
        if sentence is not None:
            self.sentences.append(sentence)
        self.uses[name] = self.uses.get(base, set()) | {len(self.sentences) - 1}
        self.amounts[name] = OPS[op](self.amounts[base], operand)
        self.lines.append(f"{_IDENT[name]} = {_IDENT[base]} {op} {written or operand}")


def _compare(story: _Story) -> bool:
    """A new person's amount told against someone's: more, fewer, times as many, or half."""
    say, r = story.say, story.say.rng
    base = r.choice(list(story.amounts))
    b, new, it = story.amounts[base], r.choice([p for p in PEOPLE if p not in story.amounts]), story.item
    kind = r.choice(["more", "fewer", "times", "half"])
    if kind == "more":
        k = r.randint(2, 40)
        text = say.one(
            f"{new} has {say.n(k)} more {it} than {base}.",
            f"{new} owns {say.n(k)} {it} more than {base} does.",
        )
        story.tell(text, new, base, "+", k)
    elif kind == "fewer" and b > 3:
        k = r.randint(1, b - 1)
        text = say.one(
            f"{new} has {say.n(k)} fewer {it} than {base}.", f"{new} has {say.n(k)} {it} less than {base}."
        )
        story.tell(text, new, base, "-", k)
    elif kind == "times" and b <= 500:
        m = r.randint(2, 5)
        times = {2: "twice", 3: "three times"}.get(m, f"{say.n(m)} times")
        text = say.one(f"{new} has {times} as many {it} as {base}.", f"{new}'s {it} are {times} {base}'s.")
        story.tell(text, new, base, "*", m)
    elif kind == "half" and b % 2 == 0:
        text = say.one(
            f"{new} has half as many {it} as {base}.", f"{new} owns half the number of {it} {base} has."
        )
        story.tell(text, new, base, "//", 2)
    else:
        return False
    return True


def _change(story: _Story) -> bool:
    """Someone's amount changes: bought or found, lost or used, given to another person."""
    say, r = story.say, story.say.rng
    who = r.choice(list(story.amounts))
    a, it = story.amounts[who], story.item
    kind = r.choice(["gain", "lose", "give", "packs"])
    if kind == "gain":
        k = r.randint(2, 60)
        text = say.one(
            f"Then {who} buys {say.n(k)} more {it}.",
            f"{who} finds another {say.n(k)} {it}.",
            f"{who} is given {say.n(k)} {it}.",
        )
        story.tell(text, who, who, "+", k)
    elif kind == "lose" and a > 2:
        k = r.randint(1, a - 1)
        text = say.one(
            f"{who} loses {say.n(k)} {it}.",
            f"Then {who} uses up {say.n(k)} of them.",
            f"{who} sells {say.n(k)} {it}.",
        )
        story.tell(text, who, who, "-", k)
    elif kind == "give" and a > 2 and len(story.amounts) > 1:
        k = r.randint(1, a - 1)
        other = r.choice([p for p in story.amounts if p != who])
        text = say.one(
            f"{who} gives {say.n(k)} {it} to {other}.", f"{who} hands {other} {say.n(k)} of the {it}."
        )
        story.tell(text, who, who, "-", k)
        story.tell(None, other, other, "+", k)
        story.uses[other] |= story.uses[who]  # the gift was drawn within the giver's amount
    elif kind == "packs":
        k, size = r.randint(2, 9), r.randint(3, 25)
        text = say.one(
            f"{who} buys {say.n(k)} packs of {size} {it}.",
            f"{who} gets {say.n(k)} packs, each with {size} {it}.",
        )
        story.tell(text, who, who, "+", k * size, f"{k} * {size}")
    else:
        return False
    return True


def _distractor(story: _Story) -> str:
    say, r = story.say, story.say.rng
    who = r.choice(list(story.amounts))
    return say.one(
        f"{who} is {say.n(r.randint(7, 14))} years old.",
        f"{who} lives {say.n(r.randint(2, 9))} km from the park.",
        f"The {story.item} came in {say.n(r.randint(3, 9))} colours.",
        f"{who}'s street has {say.n(r.randint(10, 80))} houses.",
    )


def _ask(story: _Story) -> tuple[str, int, str]:
    """The question, its answer and the program's last line: one amount, a total or a difference,
    of the amounts that need the most facts."""
    say, r, it = story.say, story.say.rng, story.item
    names = list(story.amounts)
    asks = [(n,) for n in names] + [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    most = max(len(set().union(*(story.uses[n] for n in ask))) for ask in asks)
    ask = r.choice([ask for ask in asks if len(set().union(*(story.uses[n] for n in ask))) == most])
    if len(ask) == 1:
        who = ask[0]
        q = say.one(f"How many {it} does {who} have now?", f"How many {it} does {who} end up with?")
        return q, story.amounts[who], f"print({_IDENT[who]})"
    a, b = ask
    if r.random() < 0.5:
        q = say.one(
            f"How many {it} do {a} and {b} have together?",
            f"What is the total number of {it} {a} and {b} hold?",
        )
        return q, story.amounts[a] + story.amounts[b], f"print({_IDENT[a]} + {_IDENT[b]})"
    a, b = sorted((a, b), key=lambda n: -story.amounts[n])
    q = say.one(f"How many more {it} does {a} have than {b}?", f"By how many {it} does {a} outnumber {b}?")
    return q, story.amounts[a] - story.amounts[b], f"print({_IDENT[a]} - {_IDENT[b]})"


def chain(rng: random.Random, level: int, say: Say) -> tuple[str, int, str]:
    """A story forwards: one person's amount, then ``level`` relations, then a question."""
    story = _Story(say, rng.choice(ITEMS))
    first = say.who()
    opening = say.one(
        f"{first} has {say.n(n := rng.randint(5, 90))} {story.item}.",
        f"{first} starts with {say.n(n)} {story.item}.",
    )
    story.start(opening, first, n)
    steps: list[Callable[[_Story], bool]] = [_compare]  # someone to compare with, change or give to
    while len(steps) < level:
        steps.append(rng.choice([_compare, _change]))
    for step in steps:
        while not step(story):
            pass
    sentences = story.sentences
    if level >= 3 and rng.random() < 0.5:
        sentences.insert(rng.randint(1, len(sentences)), _distractor(story))
    question, answer, last = _ask(story)
    return " ".join([*sentences, question]), answer, "\n".join([*story.lines, last])


def undo(rng: random.Random, level: int, say: Say) -> tuple[str, int, str]:
    """A story backwards: ``level`` changes to someone's amount and where it ended; the start asked."""
    who, it = say.who(), rng.choice(ITEMS)
    start = rng.randint(20, 300)
    amount, told, inverse = start, [], []
    for _ in range(level):
        kind = rng.choice(["gain", "lose", "double"] if amount <= 400 else ["gain", "lose"])
        if kind == "gain":
            k = rng.randint(2, 60)
            told.append(say.one(f"got {say.n(k)} more", f"bought {say.n(k)} {it}"))
            amount, step = amount + k, f"- {k}"
        elif kind == "lose" and amount > 2:
            k = rng.randint(1, amount // 2)
            told.append(say.one(f"lost {say.n(k)}", f"gave away {say.n(k)} {it}"))
            amount, step = amount - k, f"+ {k}"
        else:
            told.append(say.one(f"doubled the {it}", "ended up with twice as many"))
            amount, step = amount * 2, "// 2"
        inverse.append(step)
    steps = ", then ".join(told)
    text = say.one(
        f"{who} had some {it}. {who} {steps}. Now {who} has {amount} {it}. How many {it} did {who} have at first?",
        f"{who} {steps}, and now has {amount} {it}. How many {it} did {who} start with?",
    )
    lines = [f"{_IDENT[who]} = {amount}"] + [f"{_IDENT[who]} = {_IDENT[who]} {s}" for s in reversed(inverse)]
    return text, start, "\n".join([*lines, f"print({_IDENT[who]})"])


FAMILIES: dict[str, Callable[[random.Random, int, Say], tuple[str, int, str]]] = {
    "chain": chain,
    "undo": undo,
}

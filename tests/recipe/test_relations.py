"""The relation families (tasks/relations.py): answers their programs compute, levels that are
steps, varied wordings and numbers in words, the ladder's cells and its choice, and the training
data kept apart from the never-trained `transfer` set."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from collections import Counter

import pytest

from rstar2.problems import load_problems
from rstar2.recipe.curriculum import choose_cells
from rstar2.tasks.generator import ALL_FAMILIES, FAMILIES, cells, expand_families, generate
from rstar2.tasks.relations import FAMILIES as RELATIONS
from rstar2.tasks.relations import Say

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
WORDS = re.compile(
    r"\b(zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
    r"sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)\b",
    re.IGNORECASE,
)


def _printed(tasks) -> list[str]:
    program = "\n".join(f"print('#')\n{t.code}" for t in tasks)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True).stdout
    return [chunk.strip() for chunk in out.split("#")[1:]]


def test_every_family_and_level_answers_what_its_program_prints():
    tasks = generate(700, families=["relations"], seed=3, wording="varied")
    assert {(t.family, t.level) for t in tasks} == {(f, n) for f in RELATIONS for n in (1, 2, 3)}
    assert _printed(tasks) == [str(t.answer) for t in tasks]
    assert all(isinstance(t.answer, int) and t.answer >= 0 for t in tasks)
    assert all(t.row()["level"] == t.level for t in tasks)


def test_levels_are_steps_and_level_three_has_a_number_to_ignore():
    def operations(code: str) -> int:
        return len(
            re.findall(r"[-+*/%]|math\.ceil", code.split("print(", 1)[0] + code.rsplit("print(", 1)[-1])
        )

    by_level = {n: generate(140, families=["relations"], levels=(n, n), seed=1) for n in (1, 2, 3)}
    mean_ops = {n: sum(operations(t.code) for t in ts) / len(ts) for n, ts in by_level.items()}
    assert mean_ops[1] < mean_ops[2] < mean_ops[3]
    for t in by_level[3]:  # plain wording: a number in the text more often than the program uses it
        in_text = Counter(n.replace(",", "") for n in NUMBER.findall(t.problem))
        assert in_text - Counter(NUMBER.findall(t.code)), t.problem


def test_varied_wording_writes_each_situation_several_ways_and_small_numbers_in_words():
    varied = generate(700, families=["relations"], seed=2, wording="varied")
    for family in RELATIONS:
        openings = {" ".join(t.problem.split()[:3]) for t in varied if t.family == family}
        assert len(openings) >= 5, (family, openings)
    assert sum(bool(WORDS.search(t.problem)) for t in varied) > 100
    plain_say, varied_say = Say(random.Random(0), False), Say(random.Random(0), True)
    assert all(plain_say.n(k) == str(k) for k in range(30))
    assert 0.15 < sum(not varied_say.n(k % 21).isdigit() for k in range(1000)) / 1000 < 0.45


def test_the_arithmetic_families_are_drawn_as_before_and_groups_name_families():
    assert expand_families(None) == list(FAMILIES)
    assert expand_families(["relations", "product"]) == [*RELATIONS, "product"]
    with pytest.raises(ValueError, match="unknown task families"):
        expand_families(["integrals"])
    # naming the arithmetic families explicitly or by default draws the same problems
    a = generate(50, digits=(2, 3), seed=4, wording="varied")
    b = generate(50, families=["arithmetic"], digits=(2, 3), seed=4, wording="varied")
    assert [t.problem for t in a] == [t.problem for t in b] and all(t.level is None for t in a)
    assert "level" not in a[0].row()
    assert cells(["product", "ages"], (2, 3), (1, 2)) == [
        ("product", 2),
        ("product", 3),
        ("ages", 1),
        ("ages", 2),
    ]


def test_the_ladder_trains_on_the_levels_solved_sometimes_and_climbs_from_the_next_rung():
    grid = [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2), ("c", 2), ("c", 3), ("d", 1)]
    rates = [1.0, 0.5, 0.25, 0.0, 0.0, 1.0, 0.0, 1.0]
    # a: levels 2 and 3 in reach; b: none, so its lowest (next rung); c: 2 mastered, 3 next; d: done
    assert choose_cells(grid, rates) == ([1, 2, 3, 6], ["b", "c"])
    assert choose_cells(grid[:3], [1.0, 1.0, 1.0]) == ([0, 1, 2], [])  # all mastered: all cells


def _skeletons(text: str) -> set[str]:
    """A problem's sentences with every number (digits or words) masked."""
    masked = WORDS.sub("#", NUMBER.sub("#", text)).lower()
    return {s.strip() for s in re.split(r"(?<=[.?!])\s+", masked) if s.strip()}


def _pattern(text: str, answer: object) -> tuple:
    """A problem's numbers with its answer: two problems alike in both are one computation in two
    wordings (numbers alone meet by chance: a ferry's 7 cars and 293 waiting are some quotient's)."""
    return tuple(sorted(n.replace(",", "") for n in NUMBER.findall(text))), str(answer)


def shared_with_training(rows: list[dict], seeds: tuple[int, ...] = (0, 1, 2)) -> tuple[list, list, list]:
    """What ``rows`` (a set never trained on) share with every family the generator trains on (both
    wordings, every level, the recipes' digit ranges and more): their sentences (numbers masked) found
    in training problems, their problems whose numbers and answer are a training problem's; and the
    training problems themselves."""
    training = [
        t
        for seed in seeds
        for wording in ("plain", "varied")
        for t in generate(
            1500, families=list(ALL_FAMILIES), digits=(1, 4), levels=(1, 6), seed=seed, wording=wording
        )
    ]
    train_sentences = set().union(*(_skeletons(t.problem) for t in training))
    train_patterns = {_pattern(t.problem, t.answer) for t in training}
    sentences = [(r["problem"], s) for r in rows for s in _skeletons(r["problem"]) & train_sentences]
    patterns = [r["problem"] for r in rows if _pattern(r["problem"], r["answer"]) in train_patterns]
    return sentences, patterns, training


def test_no_transfer_problem_shares_a_wording_or_a_number_pattern_with_the_training_data():
    """No sentence of the never-trained set is a training sentence, and no problem's numbers and
    answer are a training problem's."""
    sentences, patterns, training = shared_with_training(load_problems("transfer"))
    assert not sentences
    assert not patterns
    # and the checks can fail: a training problem's sentences and pattern are found
    own = [{"problem": t.problem, "answer": t.answer} for t in training[:1]]
    sentences, patterns, _ = shared_with_training(own)
    assert sentences and patterns

"""The chains (tasks/chains.py): stories of one to six relations, forwards and backwards, whose
programs name one quantity per fact and print the answer; the ladder's cells over their levels; and
the training data kept apart from the `gsm_symbolic` yardstick (never a sentence or a computation of it)."""

from __future__ import annotations

import re

from rstar2.problems import load_problems
from rstar2.tasks.chains import LEVELS
from rstar2.tasks.generator import cells, generate

from .test_relations import NUMBER, WORDS, _printed, shared_with_training


def test_every_chain_answers_what_its_program_prints():
    tasks = generate(1200, families=["chains"], levels=(1, 6), seed=4, wording="varied")
    assert {(t.family, t.level) for t in tasks} == {(f, n) for f in ("chain", "undo") for n in LEVELS}
    assert _printed(tasks) == [str(t.answer) for t in tasks]
    assert all(isinstance(t.answer, int) and t.answer >= 0 for t in tasks)


def test_a_level_is_a_number_of_relations_each_one_named_quantity():
    for level in LEVELS:
        for t in generate(60, families=["chains"], levels=(level, level), seed=level):
            lines = t.code.splitlines()
            assert all(re.fullmatch(r"[a-z]+ = .+", line) for line in lines[:-1]) and lines[-1].startswith(
                "print("
            )
            if t.family == "undo":  # the end, then one line undoing each change
                assert len(lines) == level + 2 and t.problem.count(", then ") == level - 1
            else:  # the start, then each relation (a gift writes both people's amounts)
                assert level + 2 <= len(lines) <= 2 * level + 2


def test_the_question_needs_the_most_facts_and_some_facts_are_not_needed():
    """From level 3 about half the stories hold a sentence whose number the program never uses;
    below it none do. A forward story's answer reads the amounts that needed the most facts, so its
    program never prints the first sentence's amount as it was told."""

    def unused_numbers(t) -> set[str]:
        said = {n.replace(",", "") for n in NUMBER.findall(t.problem)} | {
            w.lower() for w in WORDS.findall(t.problem)
        }
        return {n for n in said if n.isdigit() and not re.search(rf"\b{n}\b", t.code)}

    low = generate(200, families=["chain"], levels=(1, 2), seed=5)
    high = generate(200, families=["chain"], levels=(3, 6), seed=5)
    assert not any(unused_numbers(t) for t in low)
    assert 0.3 < sum(bool(unused_numbers(t)) for t in high) / len(high) < 0.7
    for t in high:  # never the first sentence's amount alone
        lines = t.code.splitlines()
        first = lines[0].split(" = ")[0]
        assert lines[-1] != f"print({first})" or sum(line.startswith(f"{first} = ") for line in lines) > 1


def test_the_ladder_climbs_chains_to_six_relations_and_relations_to_three():
    grid = cells(["ages", "chains"], (1, 3), (2, 6))
    assert grid == [("ages", 2), ("ages", 3)] + [(f, n) for f in ("chain", "undo") for n in range(2, 7)]


def test_no_gsm_symbolic_problem_shares_a_sentence_or_a_computation_with_the_training_data():
    """The yardstick (reasoning-gym's gsm_symbolic, GSM8K's test set made symbolic) against every
    family the recipes train on: no sentence of it (numbers masked) is a training sentence, and no
    problem's numbers and answer are a training problem's."""
    sentences, patterns, _ = shared_with_training(
        load_problems("gym:gsm_symbolic?size=300&seed=0"), seeds=(0, 1)
    )
    assert not sentences
    assert not patterns


def test_weights_give_a_group_its_turns_and_leave_an_unweighted_generator_as_it_was():
    from collections import Counter

    weighted = Counter(t.family for t in generate(300, families=["product", "chains"], weights={"chains": 2}))
    assert 50 <= weighted["product"] <= 70 and 110 <= weighted["chain"] <= 130  # 1 : 2 : 2 turns
    plain = generate(300, families=["product", "chains"], seed=3)
    assert generate(300, families=["product", "chains"], seed=3, weights={}) == plain
    assert all(90 <= n <= 110 for n in Counter(t.family for t in plain).values())  # one turn each

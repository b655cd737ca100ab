"""What a step logs of what RL does to the programs (issue 29): computed from known rollouts by hand."""

from __future__ import annotations

import pytest

from rstar2.rl.algorithm.roc import Scored
from rstar2.rl.run.step_metrics import rollout_record, step_metrics
from rstar2.rl.trainer import task_of
from rstar2.rollout.stats import code_lines
from rstar2.rollout.trajectory import ToolCallRecord, Trajectory, Turn
from rstar2.sandbox.result import ExecResult


def call(code: str) -> ToolCallRecord:
    return ToolCallRecord("python", {"code": code}, "out", ExecResult("ok"))


def rollout(group: int, reward: float, codes: list[str], tokens: int, **task) -> Trajectory:
    t = Trajectory("p", "1", [1], response_ids=[2] * tokens, loss_mask=[1] * tokens, reward=reward)
    t.turns = [Turn("text", tokens, [call(c) for c in codes])]
    t.meta = {"group": group, **task}
    return t


@pytest.mark.parametrize(
    "code, lines",
    [
        ("print(3 * 4)", 1),
        ("a = 3\nprint(a * 4)", 2),
        ("# the price\n\na = 3\n   \nprint(a)  # done\n", 2),
        ("", 0),
    ],
)
def test_a_program_counts_the_lines_that_do_something(code, lines):
    assert code_lines(call(code)) == lines


def test_the_step_logs_programs_roc_lengths_spread_and_pass_rates():
    one, two = "print(1 + 2)", "a = 1\nb = 2\nprint(a + b)"
    rows = [
        # group 0: two correct (one kept: the short one), one incorrect kept
        (rollout(0, 1.0, [one], 10, family="chains", level=2), True),
        (rollout(0, 1.0, [two, two], 30, family="chains", level=2), False),
        (rollout(0, 0.0, [two], 20, family="chains", level=2), True),
        # group 1: every rollout correct (no spread), nothing kept
        (rollout(1, 1.0, [one], 12, family="product"), False),
        (rollout(1, 1.0, [two], 14, family="product"), False),
        # group 2: every rollout wrong, no task named
        (rollout(2, 0.0, [], 8), False),
    ]
    m = step_metrics([rollout_record(t, kept, Scored(t.reward)) for t, kept in rows])
    # calls of 2+ lines: 2 + 1 + 1 of 6 calls in all; of the kept correct (one call): none
    assert m["tools/multiline_share"] == pytest.approx(4 / 6)
    assert m["tools/multiline_share_correct_kept"] == 0.0
    assert m["roc/correct_kept_length"] == 10
    assert m["roc/correct_dropped_length"] == pytest.approx((30 + 12 + 14) / 3)
    assert m["groups/zero_spread_share"] == pytest.approx(2 / 3)
    assert m["pass/chains"] == pytest.approx(2 / 3)
    assert m["pass/chains/2"] == pytest.approx(2 / 3)
    assert m["pass/product"] == 1.0
    assert not any(k.startswith("pass/product/") for k in m)


def test_a_problem_row_names_its_task_for_the_pass_rates():
    assert task_of({"problem": "x", "family": "chains", "level": 3}) == {"family": "chains", "level": 3}
    assert task_of({"problem": "x", "family": "product"}) == {"family": "product"}
    assert task_of({"problem": "x", "gym": {"task": "chain_sum", "config": {}}}) == {"family": "chain_sum"}
    assert task_of({"problem": "x", "answer": "1"}) == {}

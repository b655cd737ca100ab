"""RoC selection against values worked out by hand (paper-notes §3.3–3.6)."""

from __future__ import annotations

import random

import pytest

from rstar2.config import RocSection
from rstar2.rl.algorithm.roc import (
    Scored,
    class_counts,
    count_answers,
    error_penalty,
    format_penalty,
    pick_positives,
    roc_counts,
    roc_select,
    score,
    select_group,
)
from rstar2.rollout.trajectory import ToolCallRecord, Trajectory, Turn
from rstar2.sandbox.result import ExecResult


def test_penalties_by_hand():
    assert error_penalty(0, 0) == 0.5  # no call: the nudge towards the tool
    assert error_penalty(4, 1) == 0.25
    assert error_penalty(3, 3) == 1.0
    assert format_penalty(0, 3) == 1.0  # no answer
    assert format_penalty(1, 3) == 0.0
    assert format_penalty(2, 4) == 0.25
    assert format_penalty(5, 2) == 1.0  # capped
    assert count_answers("<answer>1</answer> x <answer>\\boxed{2}</answer> <answer>open") == 2


@pytest.mark.parametrize(
    ("n_pos", "n_neg", "keep", "minimum", "expected"),
    [
        (16, 16, 16, 2, (8, 8)),  # half of each
        (31, 1, 16, 2, (15, 1)),  # the single negative is kept (minimum), 15 positives
        (29, 3, 16, 2, (14, 2)),  # 1.5 rounds to 2 negatives
        (1, 31, 16, 2, (1, 15)),  # mirror image
        (30, 2, 16, 0, (15, 1)),  # no minimum: proportional only
        (32, 0, 16, 2, (16, 0)),  # one class only
        (3, 2, 8, 2, (3, 2)),  # group smaller than G: kept whole
        (2, 2, 2, 2, (2, 2)),  # both minimums cannot fit: kept whole (as the released code)
    ],
)
def test_class_counts(n_pos, n_neg, keep, minimum, expected):
    assert class_counts(n_pos, n_neg, keep, minimum) == expected


def test_lowest_keeps_smallest_penalties_ties_in_rollout_order():
    rng = random.Random(0)
    assert pick_positives([0.5, 0.0, 0.25, 0.0], 2, "lowest", rng) == [1, 3]
    assert pick_positives([0.1, 0.1, 0.1], 2, "lowest", rng) == [0, 1]
    assert pick_positives([0.3, 0.2], 5, "lowest", rng) == [0, 1]


def test_weighted_takes_zero_penalty_first_then_inverse_penalty():
    penalties = [0.0, 1.0, 0.0, 2.0]
    counts = {1: 0, 3: 0}
    for seed in range(3000):
        kept = pick_positives(penalties, 3, "weighted", random.Random(seed))
        assert 0 in kept and 2 in kept  # zero penalty always kept
        counts[(set(kept) - {0, 2}).pop()] += 1
    # P(index 1) = (1/1) / (1/1 + 1/2) = 2/3
    assert counts[1] / 3000 == pytest.approx(2 / 3, abs=0.03)
    # more zero-penalty rollouts than places: uniform among them, never a penalised one
    for seed in range(50):
        assert set(pick_positives([0.0, 0.5, 0.0, 0.0], 2, "weighted", random.Random(seed))) <= {0, 2, 3}


def test_uniform_ignores_penalties_and_keeps_as_many_as_roc():
    penalties = [0.0, 1.0, 0.0, 2.0]
    counts = dict.fromkeys(range(4), 0)
    for seed in range(3000):
        kept = pick_positives(penalties, 2, "uniform", random.Random(seed))
        assert len(kept) == 2 and kept == sorted(set(kept))
        for i in kept:
            counts[i] += 1
    assert all(c / 3000 == pytest.approx(0.5, abs=0.04) for c in counts.values())  # each kept half the time
    group = [
        Scored(1.0, p_err=0.9),
        Scored(1.0),
        Scored(0.0),
        Scored(1.0, p_err=0.5),
        Scored(0.0),
        Scored(0.0),
    ]
    for seed in range(20):
        rng = random.Random(seed)
        lowest = select_group(group, RocSection(keep=4), rng).kept
        uniform = select_group(group, RocSection(keep=4, mode="uniform"), rng).kept
        assert len(lowest) == len(uniform)  # the same numbers of each class
        assert sum(group[i].correct for i in lowest) == sum(group[i].correct for i in uniform)


def test_one_incorrect_and_31_correct():
    group = [Scored(1.0, p_err=i / 31) for i in range(31)] + [Scored(0.0)]
    group = group[::-1]  # negative first, positives with decreasing penalty
    choice = select_group(group, RocSection(keep=16), random.Random(0))
    assert len(choice.kept) == 16
    assert 0 in choice.kept  # the only negative
    kept_pos = [group[i].p_err for i in choice.kept if group[i].correct]
    assert sorted(kept_pos) == [i / 31 for i in range(15)]  # the 15 cleanest


def test_all_correct_groups_are_dropped_or_kept_by_penalty():
    group = [Scored(1.0)] * 4
    assert select_group(group, RocSection(keep=2), random.Random(0)).dropped == "all_correct"
    assert select_group([Scored(0.0)] * 4, RocSection(keep=2), random.Random(0)).dropped == "all_incorrect"
    kept = select_group(group, RocSection(keep=2, drop_equal_reward_groups=False), random.Random(0))
    assert kept.kept == [0, 1] and kept.dropped is None  # zero penalty everywhere: rollout order


def test_negatives_are_uniform():
    group = [Scored(1.0)] * 8 + [Scored(0.0)] * 8
    seen = {i: 0 for i in range(8, 16)}
    for seed in range(2000):
        for i in select_group(group, RocSection(keep=8), random.Random(seed)).kept:
            if i >= 8:
                seen[i] += 1
    # each negative kept with probability 4/8
    assert all(abs(c / 2000 - 0.5) < 0.05 for c in seen.values())


def test_roc_select_keeps_clean_positives_and_counts_groups():
    g1 = [Scored(1.0, 1.0), Scored(1.0, 0.0), Scored(0.0), Scored(0.0)]
    g2 = [Scored(1.0)] * 4
    choices = roc_select([g1, g2], RocSection(keep=2, min_per_class=1), random.Random(0))
    assert choices[1].kept == []
    assert 1 in choices[0].kept and 0 not in choices[0].kept  # the clean positive, not the failing one
    m = roc_counts(choices)
    assert m["roc/groups"] == 2 and m["roc/groups_kept"] == 1
    assert m["roc/groups_all_correct"] == 1 and m["roc/groups_all_incorrect"] == 0


def _call(status: str) -> ToolCallRecord:
    return ToolCallRecord(
        "execute_python_code_with_standard_io", {"code": "x"}, "out", ExecResult(status=status)
    )


def test_score_reads_structured_statuses():
    traj = Trajectory("p", "1", [1])
    traj.turns = [
        Turn("<tool_call>..</tool_call>", 3, calls=[_call("ok"), _call("timeout")]),
        Turn("<tool_call>..</tool_call>", 3, calls=[ToolCallRecord(None, {}, "bad json", None, "parse")]),
        Turn("<answer>\\boxed{1}</answer><answer>\\boxed{1}</answer>", 5),
    ]
    traj.reward = 1.0
    s = score(traj)
    assert s.p_err == pytest.approx(2 / 3)  # a timeout and a malformed call
    assert s.p_format == pytest.approx(1 / 3)  # two answers over three turns
    assert score(traj, error=False, fmt=False).penalty == 0.0


def test_faults_of_the_code_environment_are_not_the_models_errors():
    traj = Trajectory("p", "1", [1])
    traj.turns = [
        Turn("<tool_call>..</tool_call>", 3, calls=[_call("internal"), _call("error")]),
        Turn("<tool_call>..</tool_call>", 3, calls=[_call("rejected"), _call("ok")]),
        Turn("<answer>\\boxed{1}</answer>", 5),
    ]
    traj.reward = 1.0
    assert traj.num_failed_calls == 1 and traj.num_faulted_calls == 2
    assert score(traj).p_err == pytest.approx(1 / 2)  # one error of the two calls the sandbox ran
    traj.turns[1].calls = [_call("rejected")]
    traj.turns[0].calls = [_call("internal")]
    assert score(traj).p_err == 0.5  # no call was run: as if none had been made


def test_format_penalty_counts_assistant_turns_or_tool_rounds():
    traj = Trajectory("p", "1", [1])
    traj.turns = [Turn("<answer>\\boxed{1}</answer> <answer>\\boxed{1}</answer>", 5)]
    traj.reward = 1.0
    assert score(traj).p_format == 1.0  # (2 - 1) / 1 assistant turn
    assert score(traj, format_turns="tool_rounds").p_format == 1.0  # no tool round at all
    traj.turns = [
        Turn("<tool_call>..</tool_call>", 3, calls=[_call("ok")]),
        Turn("<reason>..</reason>", 3),
        Turn("<answer>\\boxed{1}</answer>", 5),
    ]
    assert score(traj).p_format == 0.0 and score(traj, format_turns="tool_rounds").p_format == 0.0
    traj.turns[-1].text = "<answer>\\boxed{1}</answer><answer>\\boxed{1}</answer>"
    assert score(traj).p_format == pytest.approx(1 / 3)  # paper's text: over 3 assistant turns
    assert score(traj, format_turns="tool_rounds").p_format == 1.0  # released code: over 1 tool round
    traj.turns[-1].text = "<answer>\\boxed{1}</answer>"
    traj.turns[0].calls = []
    assert score(traj).p_format == 0.0 and score(traj, format_turns="tool_rounds").p_format == 1.0


def test_config_is_checked():
    with pytest.raises(ValueError, match="keep"):
        RocSection(keep=0)
    with pytest.raises(ValueError, match="mode"):
        RocSection(keep=2, mode="best")  # type: ignore[arg-type]

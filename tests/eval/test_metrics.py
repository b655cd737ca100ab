"""Evaluation metrics against values computed by hand."""

from __future__ import annotations

import pytest

from rstar2.eval.metrics import majority_correct, mean_ci95, pass_at_k, per_problem_accuracy, summarize
from rstar2.rollout.trajectory import ToolCallRecord, Trajectory, Turn
from rstar2.sandbox.result import ExecResult


def test_pass_at_k_unbiased_estimator():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 3, 2) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_mean_and_interval():
    m, h = mean_ci95([0.0, 1.0])
    assert m == 0.5 and h == pytest.approx(1.96 * (0.5 / 2) ** 0.5)
    assert mean_ci95([1.0]) == (1.0, 0.0)


def test_per_problem_accuracy_averages_the_samples_of_each_problem():
    rows = [("p", 1.0), ("p", 0.0), ("q", 1.0), ("q", 0.0)]
    trajs = [Trajectory(problem=p, reference="1", prompt_ids=[1], reward=r) for p, r in rows]
    assert per_problem_accuracy(trajs) == {"p": 0.5, "q": 0.5}


def test_majority_vote_normalizes_and_breaks_ties_by_first_seen():
    assert majority_correct([("\\frac{1}{2}", True), ("3", False), ("\\dfrac{1}{2}", True)])
    assert not majority_correct([("3", False), ("4", True)])  # tie: the first seen wins
    assert not majority_correct([(None, False), (None, False)])


def traj(
    pi: int, s: int, correct: bool, statuses: list[str], answer: str | None, finish="answer"
) -> Trajectory:
    calls = [ToolCallRecord("t", {}, "", ExecResult(status=st)) for st in statuses]  # type: ignore[arg-type]
    return Trajectory(
        "p",
        "1",
        [1],
        response_ids=[1] * 10,
        turns=[Turn("x", 10, calls)],
        finish_reason=finish,
        reward=float(correct),
        answer=answer,
        meta={"problem_index": pi, "sample": s},
    )


def test_summary_of_a_hand_built_benchmark():
    trajs = [
        traj(0, 0, True, ["ok", "error"], "1"),
        traj(0, 1, False, [], "2"),
        traj(1, 0, False, ["ok"], "5"),
        traj(1, 1, False, ["timeout"], None, "max_length"),
    ]
    s = summarize(trajs, ks=(1, 2))
    assert s["problems"] == 2 and s["samples"] == 2
    assert s["pass@1"] == pytest.approx(0.25)  # (1/2 + 0/2) / 2
    assert s["pass@2"] == pytest.approx(0.5)
    assert s["maj@2"] == pytest.approx(0.5)  # problem 0: tie 1 vs 2, first seen (right) wins
    assert s["tool_calls_per_trajectory"] == 1.0 and s["tool_error_ratio"] == pytest.approx(2 / 4)
    assert s["tool_error_ratio_correct"] == pytest.approx(1 / 2)
    assert s["finish_reasons"] == {"answer": 3, "max_length": 1}

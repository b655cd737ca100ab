"""Problems from reasoning-gym (``rstar2.gym``), real tasks: drawn by name, config, size and seed,
mixed by weight, scored by the task's own scorer where rstar2's verifier does not apply, and run
through ``rstar2 eval`` and ``rstar2 train`` with the drawn problems kept in the run folder."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
import yaml

from rstar2.config import GymSection, RolloutSection
from rstar2.config_files import ConfigError
from rstar2.gym import draw, parse_source, scored_by_task
from rstar2.problems import load_problems, source_name
from rstar2.rollout import Rollout

from .conftest import ROOT, RSTAR2
from .rollout.conftest import ScriptedEngine

WEEKDAYS = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"}


def weekday_rows() -> list[dict]:
    """calendar_arithmetic's problems whose answer is a weekday (its scorer: 0.05 in lower case)."""
    return [r for r in load_problems("gym:calendar_arithmetic?size=60&seed=2") if r["answer"] in WEEKDAYS]


def test_a_source_names_tasks_size_seed_and_config():
    spec = parse_source("gym:chain_sum?size=5&seed=7&min_terms=4&max_terms=4")
    assert (spec.size, spec.seed, [t.name for t in spec.tasks]) == (5, 7, ["chain_sum"])
    rows = draw(spec)
    assert len(rows) == 5 and all(r["problem"].count(" + ") + r["problem"].count(" - ") == 3 for r in rows)
    assert draw(spec) == rows  # seeded
    assert [r["problem"] for r in load_problems("gym:chain_sum?size=5&seed=8")] != [
        r["problem"] for r in rows
    ]
    row = rows[0]
    assert row["gym"]["task"] == "chain_sum" and row["gym"]["config"] == {"min_terms": 4, "max_terms": 4}
    assert row["gym"]["entry"]["question"] == row["problem"] and row["answer"] == str(
        row["gym"]["entry"]["answer"]
    )
    assert json.loads(json.dumps(rows)) == rows  # as run folders keep them
    assert source_name("gym:leg_counting+chain_sum?size=3") == "gym-leg_counting+chain_sum"


def test_a_mixture_follows_its_weights():
    spec = GymSection(tasks=[{"name": "leg_counting", "weight": 3}, "calendar_arithmetic"], size=400, seed=1)
    counts = Counter(r["gym"]["task"] for r in draw(spec))
    assert set(counts) == {"leg_counting", "calendar_arithmetic"}
    assert 0.65 < counts["leg_counting"] / 400 < 0.85  # 3:1


def test_unknown_tasks_and_a_missing_install_are_clear(monkeypatch):
    with pytest.raises(
        ConfigError, match=r"unknown reasoning-gym tasks \['leg_countin'\]; known: .*leg_counting"
    ):
        load_problems("gym:leg_countin")
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'rstar2\[gym\]'"):
        load_problems("gym:leg_counting")


def test_the_task_scores_what_the_math_verifier_does_not(verifier):
    weekday = weekday_rows()[0]
    gym, ref = weekday["gym"], weekday["answer"]
    assert scored_by_task(gym, ref)
    said = verifier.check(ref, f"<answer> \\boxed{{{ref}}} </answer>", gym=gym)
    assert said.correct and said.path == "task" and "scorer gave 1" in said.reason
    lower = verifier.check(ref, f"<answer> \\boxed{{{ref.lower()}}} </answer>", gym=gym)
    assert not lower.correct and "gave 0.05" in lower.reason  # partial credit is not a reward of 1
    assert verifier.check(ref, "<answer> no box </answer>", gym=gym).path == "none"
    # a plain number is the verifier's: "1,000" is a thousand to it, 1 to gsm_symbolic's scorer
    number = {**load_problems("gym:gsm_symbolic?size=1&seed=0")[0]["gym"]}
    number["entry"] = {**number["entry"], "answer": "1000"}
    assert not scored_by_task(number, "1000")
    assert verifier.check("1000", "<answer> \\boxed{1,000} </answer>", gym=number).correct
    by_task = verifier.check("1000", "<answer> \\boxed{1,000} </answer>", gym={**number, "score": "task"})
    assert not by_task.correct and by_task.path == "task"


async def test_rollouts_on_gym_problems_are_rewarded_by_the_task(chatml, tiny, pool, verifier):
    rows = weekday_rows()[:2]
    right, wrong = rows
    scripts = {
        right["problem"]: [f"<answer> \\boxed{{{right['answer']}}} </answer>"],
        wrong["problem"]: [f"<answer> \\boxed{{{wrong['answer'].lower()}}} </answer>"],
    }
    engine = ScriptedEngine(
        chatml, scripts, tiny[1].convert_tokens_to_ids("<|im_end|>"), "<|im_start|>assistant"
    )
    rollout = Rollout(engine, chatml, pool, verifier, RolloutSection(max_turns=2))
    got = await rollout.run_many(
        [{"problem": r["problem"], "answer": r["answer"], "gym": r["gym"]} for r in rows]
    )
    assert [t.reward for t in got] == [1.0, 0.0]
    assert "calendar_arithmetic's scorer gave 1" in got[0].verdict and got[1].fault is None


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eval_and_train_draw_from_reasoning_gym_and_keep_the_problems(tiny_dir, tmp_path):
    source = "gym:leg_counting+calendar_arithmetic?size=4&seed=5"
    out = tmp_path / "eval"
    args = ["eval", "--model", str(tiny_dir), "--bench", source, "--samples", "1", "--max-tokens", "8",
            "--max-turns", "1", "--out", str(out), "--device", "cpu"]  # fmt: skip
    run = subprocess.run(RSTAR2 + args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    folder = out / "gym-leg_counting+calendar_arithmetic"
    kept = [json.loads(x) for x in (folder / "problems.jsonl").read_text().splitlines()]
    assert kept == load_problems(source)  # the same draw, reproducible from the source
    assert len((folder / "trajectories.jsonl").read_text().splitlines()) == 4
    assert json.loads((out / "summary.json").read_text())["benchmarks"][folder.name]["problems"] == 4

    config = tmp_path / "rl.yaml"
    tree = {
        "kind": "rl",
        "model": {"path": str(tiny_dir), "threads": 1, "compute": "fp32"},
        "data": {"gym": {"tasks": ["leg_counting", {"name": "chain_sum", "config": {"max_terms": 3}}], "size": 6}},
        "rollout": {"samples": 2, "max_turns": 1, "max_response_tokens": 4, "tools_in_prompt": False,
                    "sandbox_workers": 1, "verifier_workers": 1},
        "roc": {"keep": 2},
        "run": {"out": str(tmp_path / "rl"), "steps": 1, "batch_size": 2, "progress": False},
    }  # fmt: skip
    config.write_text(yaml.safe_dump(tree))
    run = subprocess.run(
        RSTAR2 + ["train", str(config)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    problems = [json.loads(x) for x in (tmp_path / "rl" / "problems.jsonl").read_text().splitlines()]
    assert len(problems) == 6 and {p["gym"]["task"] for p in problems} <= {"leg_counting", "chain_sum"}
    assert len((tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()) == 1

"""``rstar2 compare`` end to end on a miniature recipe run: every arm starts from the source run's
SFT checkpoint with its variant's RoC settings and seed, the summary's numbers are those of the
arms' own files, and a second call finds everything done."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from rstar2.eval.metrics import per_problem_accuracy
from rstar2.recipe.compare import DEFAULT_VARIANTS, arm_tree, arms, parse_lever, source_run
from rstar2.recipe.report_card import eval_dir, sampled_trajectories
from rstar2.recipe.run import run_recipe
from rstar2.recipe.spec import parse_recipe
from rstar2.rl.run.metrics_log import read_metrics
from rstar2.rollout.stats import code_lines
from rstar2.rollout.trajectory import read_trajectories

from ..conftest import ROOT, RSTAR2
from .test_recipe import miniature


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A finished miniature recipe run: SFT, then one RL stage; held-out and one other set."""
    root = tmp_path_factory.mktemp("compare")
    other = root / "other.jsonl"
    other.write_text(
        "".join(json.dumps({"problem": f"Add {i} and {i}.", "answer": str(2 * i)}) + "\n" for i in range(3))
    )
    tree = miniature()
    tree["stages"] = tree["stages"][:2]
    tree["stages"][1].pop("filter")
    gym = "gym:leg_counting?size=2&seed=0"  # a set whose folder is named for its source, not its text
    tree["eval"].update(before=False, plain_before=False, also=[str(other), gym], entropy_trajectories=0)
    run_recipe(parse_recipe(tree), root / "run", progress=False, log=lambda s: None)
    return root / "run"


def test_an_arm_is_the_rl_stages_from_the_sft_checkpoint_with_the_variants_roc(source):
    tree, checkpoint = source_run(source)
    assert checkpoint.name == "step-000002" and "01-sft" in str(checkpoint)
    t = arm_tree(tree, checkpoint, "grpo-kept", 4, ["stages.rl-64.run.steps=3"])  # 2G = 4, G = 2
    assert t["model"]["path"] == str(checkpoint) and "build" not in t["model"]
    assert [s["name"] for s in t["stages"]] == ["rl-64"] and t["stages"][0]["run"]["steps"] == 3
    assert t["defaults"]["rl"]["run"]["seed"] == 4
    assert (t["stages"][0]["rollout"]["samples"], t["stages"][0]["roc"]["enabled"]) == (2, False)  # G sampled
    uniform = arm_tree(tree, checkpoint, "roc-uniform", 0)["stages"][0]
    assert uniform["roc"] == {"enabled": True, "mode": "uniform"} and "samples" not in uniform.get(
        "rollout", {}
    )
    assert t["eval"]["before"] is False and t["eval"]["entropy_trajectories"] == 0
    assert tree["stages"][0]["kind"] == "sft"  # the source tree is left as it was
    assert arm_tree(tree, checkpoint, "roc", 0, stages=["rl-64"])["stages"][0]["name"] == "rl-64"
    # asynchronous variants: RoC as the recipe has it, k updates of staleness, with or without the
    # decoupled correction (AReaL's ablation); each arm's recipe parses
    k1 = arm_tree(tree, checkpoint, "async-k1", 0)["stages"][0]
    assert k1["asynchronous"] == {"max_staleness": 1} and k1["loss"] == {"tis_cap": 2.0}
    assert "max_staleness" not in k1.get("rollout", {})
    none = arm_tree(tree, checkpoint, "async-k4-none", 0)
    stage = none["stages"][0]
    assert stage["asynchronous"] == {"max_staleness": 4} and stage["loss"] == {"tis_cap": None}
    parse_recipe(none, check_paths=False)
    with pytest.raises(ValueError, match="the recipe's RL stages are"):
        arm_tree(tree, checkpoint, "roc", 0, stages=["sft"])
    with pytest.raises(ValueError, match="unknown variants"):
        arms(source, ["roc", "ppo"], [0])
    with pytest.raises(ValueError, match="unknown variant 'ppo'"):  # called from Python: never plain GRPO
        arm_tree(tree, checkpoint, "ppo", 0)
    with pytest.raises(ValueError, match="not a recipe run folder"):
        source_run(source / "01-sft")


def test_a_lever_of_ones_own_is_roc_with_its_settings(source):
    tree, checkpoint = source_run(source)
    name, sets = parse_lever("kl: defaults.rl.loss.kl_coef=0.05; defaults.rl.optim.lr=3e-6")
    assert (name, sets) == ("kl", ["defaults.rl.loss.kl_coef=0.05", "defaults.rl.optim.lr=3e-6"])
    t = arm_tree(tree, checkpoint, "kl", 1, levers={name: sets})
    assert (
        t["defaults"]["rl"]["loss"]["kl_coef"] == 0.05 and float(t["defaults"]["rl"]["optim"]["lr"]) == 3e-6
    )
    assert t["stages"][0]["roc"] == {"enabled": True} and t["defaults"]["rl"]["run"]["seed"] == 1
    parse_recipe(t, check_paths=False)
    assert [a.name for a in arms(source, ["roc", "kl"], [0, 1], {"kl": sets})] == [
        "roc-s0", "kl-s0", "roc-s1", "kl-s1"
    ]  # fmt: skip
    for bad in ("kl", "kl:", "roc:loss.kl_coef=1", "kl:loss.kl_coef"):
        with pytest.raises(ValueError, match="NAME:KEY=VALUE"):
            parse_lever(bad)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_compare_runs_every_arm_and_summarizes_their_own_numbers(source, tmp_path):
    out = tmp_path / "cmp"
    wide = {**os.environ, "COLUMNS": "400"}
    cmd = [
        *RSTAR2,
        "compare",
        str(source),
        "--out",
        str(out),
        "--seeds",
        "2",
        "--parallel",
        "3",
        "--no-progress",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1100, env=wide)
    assert r.returncode == 0, r.stderr[-3000:]
    _, checkpoint = source_run(source)
    summary = json.loads((out / "compare.json").read_text())
    assert list(summary["variants"]) == list(DEFAULT_VARIANTS) and summary["sets"] == [
        "heldout",
        "other",
        "gym-leg_counting",
    ]
    for variant in DEFAULT_VARIANTS:
        entry = summary["variants"][variant]
        assert entry["seeds"] == [0, 1]
        for seed in (0, 1):
            arm = out / f"{variant}-s{seed}"
            stage = yaml.safe_load((arm / "01-rl-64" / "config.yaml").read_text())
            assert stage["model"]["path"] == str(checkpoint) and stage["run"]["seed"] == seed
            sampled, roc = stage["rollout"]["samples"], stage["roc"]["enabled"]
            assert (sampled, roc) == {"roc": (4, True), "grpo-kept": (2, False), "grpo-all": (4, False)}[
                variant
            ]
            m = read_metrics(arm / "01-rl-64" / "metrics.jsonl")[0]
            assert m["rollouts"] == sampled * 2  # 2 problems a step
            if roc:
                assert m["rollouts_kept"] <= stage["roc"]["keep"] * m["roc/groups_kept"]
            else:  # plain GRPO: every rollout of a group with a signal
                assert m["rollouts_kept"] == sampled * m["roc/groups_kept"]
            held = per_problem_accuracy(read_trajectories(sampled_trajectories(eval_dir(arm, 1, "rl-64")))[0])
            assert entry["final"]["heldout"]["per_seed"][seed] == pytest.approx(
                sum(held.values()) / len(held)
            )
            assert [r["step"] for r in entry["steps"][str(seed)]] == [1]
        start = per_problem_accuracy(read_trajectories(sampled_trajectories(out / "sft" / "heldout"))[0])
        assert entry["final"]["heldout"]["start"] == pytest.approx(sum(start.values()) / len(start))
        # the programs: the share of the final evaluations' tool calls with two or more lines, each
        # seed's from its own trajectories, and the SFT checkpoint's
        shares = []
        for seed in (0, 1):
            trajs = read_trajectories(sampled_trajectories(eval_dir(out / f"{variant}-s{seed}", 1, "rl-64")))[
                0
            ]
            calls = [c for t in trajs for c in t.calls]
            shares.append(sum(code_lines(c) >= 2 for c in calls) / len(calls) if calls else 0.0)
        assert entry["final"]["heldout"]["multiline"] == pytest.approx(sum(shares) / 2)
        assert 0 <= entry["final"]["heldout"]["multiline_start"] <= 1
    assert summary["reference"] == "roc" and set(summary["versus"]) == {"grpo-kept", "grpo-all"}
    text = (out / "compare.md").read_text()
    assert "roc minus grpo-all: heldout" in text and "| roc | 2 |" in text
    assert "Tool calls of two or more lines after the stages" in text
    assert (out / "compare_tools_error_ratio_correct_kept.png").stat().st_size > 0
    costs = json.loads((out / "costs.json").read_text())
    assert set(costs) == {"sft"} | {f"{v}-s{s}" for v in DEFAULT_VARIANTS for s in (0, 1)}
    assert all(c["seconds"] > 0 and c["peak_gib"] > 0 for c in costs.values())
    # a second call finds every arm done: nothing reruns, the summary is rewritten
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=wide)
    assert again.returncode == 0 and "compare: run" not in again.stderr and "evaluating" not in again.stderr
    assert json.loads((out / "costs.json").read_text()) == costs
    bad = subprocess.run(
        [*RSTAR2, "compare", str(tmp_path)], capture_output=True, text=True, timeout=300, env=wide
    )
    assert bad.returncode == 2 and "not a recipe run folder" in bad.stderr


def test_the_recipe_runs_benchmark_pairs_two_runs_problem_by_problem(source, tmp_path):
    """``benchmarks/recipe_runs.py``: one phase per evaluation and stage, and each evaluation's change
    against the first run paired over its problems (here: the copy has one held-out problem's
    samples all turned the other way)."""
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    held = sampled_trajectories(eval_dir(copy, 2, "rl-64"))
    rows = [json.loads(line) for line in held.read_text().splitlines()]
    first = [r for r in rows if r["problem"] == rows[0]["problem"]]
    flipped = 0.0 if all(r["reward"] > 0 for r in first) else 1.0
    for r in first:
        r["reward"] = flipped
    held.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before, after = (
        per_problem_accuracy(read_trajectories(sampled_trajectories(eval_dir(run, 2, "rl-64")))[0])
        for run in (source, copy)
    )
    change = (sum(after.values()) - sum(before.values())) / len(before)
    assert change != 0
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "recipe_runs.py"), str(source), str(copy)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    times, scores = proc.stdout.split("\n\n")
    phases = [line.split(" | ")[0].strip("| ") for line in times.splitlines()[2:]]
    assert {"01-sft training", "02-rl-64 training", "02-rl-64", "01-sft", "**whole**"} <= set(phases)
    rows = {line.split(" | ")[0].strip("| "): line for line in scores.splitlines()[2:]}
    assert f"({100 * change:+.1f} ±" in rows["02-rl-64"] and f", {len(before)}) |" in rows["02-rl-64"]
    assert "(+0.0 ± 0.0," in rows["01-sft"]

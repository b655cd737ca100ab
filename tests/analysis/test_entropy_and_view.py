"""Entropy analysis (exact values, classes of a hand-built trajectory, the whole report on a tiny
model) and the trajectory viewer (every status rendered, model text escaped, the CLI)."""

from __future__ import annotations

import html
import json
import math
import os
import subprocess

import pytest
import torch

from rstar2.analysis.entropy import (
    TrajectoryEntropy,
    entropy_of_logits,
    mark_high,
    summarize,
    teacher_forced_entropy,
    top_share_mask,
)
from rstar2.analysis.view import STATUS_COLOURS, find_files, render
from rstar2.chat.token_classes import block_regions, classify

from ..conftest import RSTAR2


def test_entropy_of_uniform_and_one_hot_distributions():
    v = 37
    assert entropy_of_logits(torch.zeros(v)).item() == pytest.approx(math.log(v), rel=1e-6)
    one_hot = torch.full((v,), -1e4)
    one_hot[3] = 0.0
    assert entropy_of_logits(one_hot).item() == pytest.approx(0.0, abs=1e-6)
    two = torch.tensor([0.0, 0.0, -1e4])
    assert entropy_of_logits(two).item() == pytest.approx(math.log(2), rel=1e-6)
    # temperature flattens: at T → large every distribution tends to uniform
    peaked = torch.tensor([5.0, 0.0, 0.0, 0.0])
    assert entropy_of_logits(peaked, 100.0).item() > entropy_of_logits(peaked).item()


def test_top_share_marks_the_highest_and_never_tool_tokens():
    assert top_share_mask([0.1, 0.9, 0.5, 0.9], 0.5) == [False, True, False, True]
    assert top_share_mask([0.3], 0.2) == [True]  # at least one
    with pytest.raises(ValueError, match="--top"):
        top_share_mask([1.0], 0.0)
    assert mark_high([0.2, None, 5.0, 0.1, None], 0.34) == [False, False, True, False, False]


def test_a_hand_built_trajectory_is_classified():
    turn1 = [
        "Let",
        " me",
        " add",
        ".",
        "<tool_call>",
        '{"code":',
        ' "print(2+2)"}',
        "</tool_call>",
        "<|im_end|>",
    ]
    tool = ["<|im_start|>", "user", "<tool_response>", "4", "</tool_response>"]
    turn2 = ["The", " output", " says", " 4", ".", " So", "<answer>", "4", "</answer>"]
    pieces = turn1 + tool + turn2
    mask = [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2)
    got = classify(pieces, mask, window=3)
    assert got[:4] == ["reasoning"] * 4  # the first turn follows no tool response
    assert got[4:8] == ["code"] * 4 and got[8] == "reasoning"
    assert got[9:14] == [None] * 5
    assert got[14:17] == ["reflection"] * 3  # the first three tokens after the tool output
    assert got[17:20] == ["reasoning"] * 3
    assert got[20:] == ["answer"] * 3
    # a tag split over tokens still opens the block; an unclosed block runs to the end
    assert classify(["<tool", "_call>", "x"], [1, 1, 1]) == ["code"] * 3
    assert block_regions("a<answer>1") == [(1, 10, "answer")]


def test_summary_counts_per_class():
    items = [
        TrajectoryEntropy(
            pieces=["a", "b", "c", "d"],
            entropy=[1.0, None, 3.0, 0.5],
            classes=["reasoning", None, "reflection", "code"],
            high=[False, False, True, False],
        )
    ]
    s = summarize(items, bins=2)
    rows = {r["class"]: r for r in s.rows()}
    assert rows["reflection"]["high"] == 1 and rows["reflection"]["share_of_high"] == 1.0
    assert rows["reasoning"]["tokens"] == 1 and rows["answer"]["tokens"] == 0
    assert s.top_tokens["reflection"] == [("c", 1)]
    assert s.by_position == pytest.approx([(1.0 + 3.0) / 2, 0.5])


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from rstar2.recipe.tiny_model import build_model, build_tokenizer, save_pretrained

    tok = build_tokenizer(["<reason> 2 + 2 </reason> print(4) <answer> 4 </answer>"] * 50, 400)
    model = build_model(tok, hidden=32, layers=1, heads=2, mlp=64, max_positions=256)
    return save_pretrained(model, tok, tmp_path_factory.mktemp("tiny-analysis"))


def test_teacher_forced_entropy_is_that_of_the_next_token_distribution(tiny_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    prompt, response = [5, 6, 7], [8, 9]
    got = teacher_forced_entropy(model, prompt, response)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0]
    p = logits[2].softmax(-1)
    assert got[0] == pytest.approx(-(p * p.log()).sum().item(), rel=1e-5)  # the dist. token 8 came from
    assert len(got) == 2


def test_the_analysis_writes_its_report(tiny_dir, tmp_path):
    from transformers import AutoTokenizer

    from rstar2.analysis.entropy_report import analyze

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model_ids = tok.encode("<reason> 2 + 2 </reason> <answer> 4 </answer>", add_special_tokens=False)
    tool_ids = tok.encode(" print(4) ", add_special_tokens=False)
    rows = [
        {
            "problem": "<b>2 + 2</b>",
            "reward": 1.0,
            "prompt_ids": tok.encode("2 + 2", add_special_tokens=False),
            "response_ids": model_ids + tool_ids + model_ids,
            "loss_mask": [1] * len(model_ids) + [0] * len(tool_ids) + [1] * len(model_ids),
            "turns": [],
        }
    ] * 3
    path = tmp_path / "trajectories.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    out = tmp_path / "entropy"
    summary = analyze(tiny_dir, path, out, top=0.25, window=4, device="cpu", progress=False)
    assert summary.high_total == 3 * round(0.25 * 2 * len(model_ids))
    data = json.loads((out / "entropy.json").read_text())
    assert {r["class"] for r in data["classes"]} == {"reasoning", "reflection", "code", "answer"}
    assert sum(r["tokens"] for r in data["classes"]) == 3 * 2 * len(model_ids)
    assert (out / "entropy.png").stat().st_size > 0 and "| reflection |" in (out / "entropy.md").read_text()
    page = (out / "tokens.html").read_text()
    assert "&lt;b&gt;2 + 2&lt;/b&gt;" in page and "<b>2 + 2</b>" not in page


# -- viewer ---------------------------------------------------------------------------------------
EVIL = "<script>alert('x')</script>"


def trajectory(status: str | None, reward: float, kept: bool | None = None) -> dict:
    result = None if status is None else {"status": status, "stdout": EVIL, "duration_s": 0.01}
    call = {"name": "python", "arguments": {"code": f"print('{EVIL}')"}, "response": EVIL, "result": result}
    if status is None:
        call["error"] = f"bad JSON {EVIL}"
    meta = {} if kept is None else {"roc": {"kept": kept, "p_err": 0.5, "p_format": 0.0}, "step": 3}
    return {
        "problem": f"Solve {EVIL}",
        "reference": "4",
        "prompt_ids": [1],
        "response_ids": [2, 3, 4],
        "loss_mask": [1, 0, 1],
        "turns": [{"text": f"I think {EVIL}", "model_tokens": 3, "calls": [call]}],
        "finish_reason": "answer",
        "reward": reward,
        "answer": EVIL,
        "verdict": "equal",
        "meta": meta,
    }


def test_the_viewer_renders_every_status_and_escapes_model_text():
    statuses = [s for s in STATUS_COLOURS if s != "malformed"]
    items = [("f.jsonl", trajectory(s, float(i % 2), kept=bool(i % 2))) for i, s in enumerate(statuses)]
    items.append(("f.jsonl", trajectory(None, 0.0)))
    page = render(items)
    assert "<script>alert" not in page  # no injection from model, tool, problem or answer text
    assert page.count("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;") >= 5 * len(items)
    for s in STATUS_COLOURS:
        assert f"data-statuses='{s}'" in page and STATUS_COLOURS[s] in page
    assert "RoC: <b>kept</b>" in page and "RoC: <b>dropped</b>" in page and "data-kept=''" in page
    assert page.count("data-reward='correct'") == sum(i % 2 for i in range(len(statuses)))


def test_view_command_on_a_run_folder(tmp_path):
    run = tmp_path / "run"
    (run / "samples").mkdir(parents=True)
    (run / "samples" / "step_000001.jsonl").write_text(json.dumps(trajectory("ok", 1.0, True)) + "\n{cut")
    (run / "aime24").mkdir()
    (run / "aime24" / "trajectories.jsonl").write_text(json.dumps(trajectory("timeout", 0.0)) + "\n")
    assert [p.name for p in find_files(run)] == ["trajectories.jsonl", "step_000001.jsonl"]
    r = subprocess.run([*RSTAR2, "view", str(run)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    page = (run / "view.html").read_text()
    assert "2 trajectories, 1 correct" in page and "<select id='status'" in page
    wide = {**os.environ, "COLUMNS": "400"}  # the error box must not wrap the message
    bad = subprocess.run(
        [*RSTAR2, "view", str(tmp_path / "nothing")], capture_output=True, text=True, timeout=300, env=wide
    )
    assert bad.returncode == 2 and "does not exist" in bad.stderr, bad.stderr  # the option's own check


def test_the_viewer_shows_and_filters_tool_use_health(tmp_path):
    silent = {**trajectory("ok", 1.0), "turns": [{"text": "no call", "model_tokens": 2, "calls": []}]}
    cut = trajectory("output_limit", 0.0)
    broken = trajectory(None, 0.0)  # a malformed call
    page = render([("f", silent), ("f", cut), ("f", broken), ("f", trajectory("ok", 1.0))])
    assert "data-health='no_call'" in page and "data-health='output_cut'" in page
    assert "data-health='unparseable'" in page and "data-health='healthy'" in page
    assert "<select id='health'" in page and "no tool call (1)</option>" in page
    assert "health: <b>tool output cut at the limit</b>" in page
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps(d) + "\n" for d in (silent, cut, broken, trajectory("ok", 1.0))))
    r = subprocess.run(
        [*RSTAR2, "view", str(f), "--health", "no_call"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    only = (tmp_path / "view.html").read_text()
    assert "1 trajectories, 1 correct" in only and "data-health='no_call'" in only
    wide = {**os.environ, "COLUMNS": "400"}
    bad = subprocess.run(
        [*RSTAR2, "view", str(f), "--health", "silence"],
        capture_output=True,
        text=True,
        timeout=300,
        env=wide,
    )
    assert bad.returncode != 0 and "unknown health sign 'silence'" in bad.stderr


def test_the_viewer_shows_a_file_of_drawn_problems_escaped(tmp_path):
    from rstar2.analysis.view import view
    from rstar2.problems import load_problems

    rows = load_problems("gym:leg_counting?size=3&seed=4")
    rows.append({"problem": "<script>alert('x')</script>", "answer": "<b>1</b>", "source": "mine"})
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = view(path).read_text()
    assert "4 problems." in page and page.count("gym:leg_counting") == 3
    assert all(html.escape(r["problem"]) in page for r in rows[:3])
    assert "<script>alert" not in page and "<b>1</b>" not in page

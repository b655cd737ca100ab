"""The `rstar2` command as a user types it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import ROOT

COMMANDS = [
    [],
    ["sandbox"],
    ["sandbox", "run"],
    ["sandbox", "serve"],
    ["sandbox", "worker"],
    ["sandbox", "info"],
    ["demo"],
    ["verify"],
    ["serve"],
    ["chat"],
    ["eval"],
    ["train"],
    ["analyze"],
    ["analyze", "entropy"],
    ["view"],
    ["model"],
    ["model", "import"],
]


def rstar2(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rstar2.cli", *args],
        input=input,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "rstar2")
def test_every_command_has_help(cmd):
    r = rstar2(*cmd, "--help")
    assert r.returncode == 0 and "Usage" in r.stdout


def test_sandbox_run_file_and_stdin(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("n = int(input())\nprint(sum(range(n)))\n")
    r = rstar2("sandbox", "run", str(script), "--input", "10")
    assert r.returncode == 0 and r.stdout == "45\n" and "status: ok" in r.stderr
    r = rstar2("sandbox", "run", "-", "--json", input="1/0")
    assert r.returncode == 1
    result = json.loads(r.stdout)
    assert result["status"] == "error" and result["error_type"] == "ZeroDivisionError"


def test_sandbox_info_lists_layers():
    r = rstar2("sandbox", "info", "--json")
    assert r.returncode == 0
    layers = {layer["name"] for layer in json.loads(r.stdout)["layers"]}
    assert {"net", "pid", "fs", "seccomp", "rlimits", "env"} <= layers


def test_verify_one_pair_sets_the_exit_status(tmp_path):
    good = rstar2(
        "verify", "--reference", "\\frac{1}{2}", "--response", "-", input="<answer>\\boxed{0.5}</answer>"
    )
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["correct"] is True
    bad = rstar2("verify", "-r", "3", "--response", "-", input="<answer>\\boxed{4}</answer>")
    assert bad.returncode == 1 and json.loads(bad.stdout)["reason"] == "different numbers"


def test_verify_lenient_reads_an_answer_in_a_sentence():
    said = "Adding both groups, she has 1,234 stickers left."
    lenient = rstar2("verify", "-r", "1234", "--response", "-", "--mode", "lenient", input=said)
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr
    assert json.loads(lenient.stdout)["answer"] == "1,234 stickers left"
    strict = rstar2("verify", "-r", "1234", "--response", "-", input=said)  # no <answer> block
    assert strict.returncode == 1 and json.loads(strict.stdout)["path"] == "none"
    wrong = rstar2("verify", "-r", "1234", "--response", "-", "--mode", "lenient", input="It is not 1,234.")
    assert wrong.returncode == 1


def test_verify_jsonl_prints_a_verdict_per_line_and_a_summary(tmp_path):
    rows = [
        {"reference": "117", "response": "<answer>\\boxed{117}</answer>", "label": True},
        {"reference": "\\sqrt{8}", "response": "<answer>\\boxed{2\\sqrt{2}}</answer>", "label": True},
        {"reference": "\\pi", "response": "<answer>\\boxed{3.14}</answer>", "label": False},
        {"reference": 5, "response": "nothing", "label": False},
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    r = rstar2("verify", "--jsonl", str(path), "--workers", "1")
    assert r.returncode == 0, r.stderr
    verdicts = [json.loads(line) for line in r.stdout.splitlines()]
    assert [v["correct"] for v in verdicts] == [True, True, False, False]
    assert "precision" in r.stderr and "100.00%" in r.stderr


def test_verify_rejects_bad_input_clearly(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"reference": "1"}\n')
    r = rstar2("verify", "--jsonl", str(path))
    assert r.returncode != 0 and "needs the fields" in r.stderr
    r = rstar2("verify", "--reference", "1")
    assert r.returncode != 0 and "either --reference and --response, or --jsonl" in r.stderr

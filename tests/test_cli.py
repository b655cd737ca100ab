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
    ["sandbox", "bench"],
    ["demo"],
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

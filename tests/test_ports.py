"""Every service binds its port before it loads anything (a model, sandbox workers), so a port taken
fails at once with one ``error:`` line naming it, and the address it says is read from the socket it
listens on: `rstar2 serve`, `rstar2 sandbox serve`, `rstar2 vllm` and the trainer's weight service."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import httpx
import pytest

from rstar2.local_service import free_port, wait_healthy

from .conftest import ROOT, RSTAR2, stop

URL = re.compile(r"(http://[\w.:\[\]]+?:\d+)")
ENV = {**os.environ, "COLUMNS": "200"}  # rich wraps at 80 columns when not on a terminal


def commands(model: str, root: str, port: int) -> dict[str, list[str]]:
    return {
        "serve": [*RSTAR2, "serve", "--model", model, "--port", str(port), "--device", "cpu"],
        "sandbox serve": [*RSTAR2, "sandbox", "serve", "--port", str(port), "--workers", "1"],
        "vllm": [*RSTAR2, "vllm", "--model", model, "--port", str(port), "--python", sys.executable],
        "weight service": [
            sys.executable,
            "-m",
            "rstar2.weight_transfer",
            "--root",
            root,
            "--port",
            str(port),
        ],
    }


@pytest.mark.parametrize("service", ["serve", "sandbox serve", "vllm", "weight service"])
def test_a_port_taken_is_one_error_line_naming_it_before_anything_loads(service, tmp_path):
    """The model given to `rstar2 serve` and `rstar2 vllm` is an empty folder, whose load would fail
    with an error about the model: the error is the port's, so the port was bound first."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = commands(str(tmp_path), str(tmp_path), port)[service]
        done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=240)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode != 0 and len(errors) == 1, done.stderr
    assert f"127.0.0.1:{port}" in errors[0] and "in use" in errors[0], done.stderr
    assert "Traceback" not in done.stderr


def test_rstar2_serve_listens_before_it_loads_its_model(tmp_path):
    """Its address is said (and bound) before the model loads: a model that fails to load comes after."""
    port = free_port()
    args = commands(str(tmp_path), str(tmp_path), port)["serve"]
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=240)
    lines = done.stderr.splitlines()
    listening = next(i for i, line in enumerate(lines) if f"listening on http://127.0.0.1:{port}/v1" in line)
    failed = next(i for i, line in enumerate(lines) if line.startswith("error:"))
    assert done.returncode != 0 and listening < failed and "model_type" in done.stderr, done.stderr


def said_address(proc: subprocess.Popen, marker: str) -> str:
    """The address in the first line of ``proc``'s stderr holding ``marker``."""
    for line in proc.stderr:  # type: ignore[union-attr]
        if marker in line:
            return URL.search(line).group(1)  # type: ignore[union-attr]
    raise AssertionError(f"{proc.args} exited without saying its address ({marker!r})")


@pytest.mark.parametrize(
    "service, any_port",
    [("serve", False), ("serve", True), ("sandbox serve", True), ("weight service", True)],
)
def test_the_address_a_service_says_is_the_one_it_answers_on(service, any_port, tiny_dir, tmp_path):
    """`--port 0` takes any free port, and the address said is the one bound (not port 0); a port
    given is the one said."""
    port = 0 if any_port else free_port()
    args = commands(str(tiny_dir), str(tmp_path), port)[service]
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV
    )
    try:
        url = said_address(proc, "listening on" if service != "weight service" else "weight service on")
        assert (
            url == f"http://127.0.0.1:{port}"
            if port
            else url.startswith("http://127.0.0.1:") and not url.endswith(":0")
        ), url
        wait_healthy(url, proc, 240)
        if service == "serve":  # answered once loaded (503 before, /health too)
            assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == tiny_dir.name
    finally:
        stop(proc)

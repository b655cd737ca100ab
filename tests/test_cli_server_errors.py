"""A server that refuses rstar2 (401 without its key, 403) or is not there, and a Redis URL that is
not Redis: `rstar2 eval`, `rstar2 chat` and `rstar2 sandbox worker` say so in one `error:` line,
without a traceback, as `rstar2 train` does (exit 1: a run that failed; the worker's bad --redis
exits 2, as a refused Redis password does)."""

from __future__ import annotations

import os
import socket
import subprocess
import threading

import pytest

from .conftest import ROOT, RSTAR2, free_port, proxy, serve_model

KEY = "key-for-these-tests"


@pytest.fixture(scope="module")
def keyed(tiny_dir):
    yield from serve_model(tiny_dir, "--device", "cpu", "--api-key", KEY)


def error_lines(run: subprocess.CompletedProcess) -> int:
    return sum(line.startswith("error:") for line in (run.stdout + run.stderr).splitlines())


def said_once(args: list[str], code: int, words: str, **kw) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RSTAR2_API_KEY"}
    run = subprocess.run(
        [*RSTAR2, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, **kw
    )
    said = " ".join((run.stdout + run.stderr).split())
    assert run.returncode == code and words in said, (args, said[-2000:])
    assert error_lines(run) == 1 and "Traceback" not in said, (args, said[-2000:])


def clients(url: str, tiny_dir, tmp_path) -> list[list[str]]:
    (tmp_path / "p.jsonl").write_text('{"problem": "1 + 1", "answer": "2"}\n')
    common = ["--servers", url, "--tokenizer", str(tiny_dir), "--max-tokens", "8"]
    evaluate = ["eval", *common, "--bench", str(tmp_path / "p.jsonl"), "-k", "1", "--no-progress"]
    return [[*evaluate, "--out", str(tmp_path / "e")], ["chat", *common, "-p", "1 + 1"]]


def test_a_keyed_server_without_its_key(keyed, tiny_dir, tmp_path):
    for args in clients(keyed, tiny_dir, tmp_path):
        said_once(args, 1, "refused rstar2's request (401): set $RSTAR2_API_KEY")


def test_a_server_that_answers_403(keyed, tiny_dir, tmp_path):
    def forbid(path, body):
        return ({"error": "forbidden here"}, 403) if path.endswith("completions") else None

    with proxy(keyed, intercept=forbid) as url:
        os.environ["RSTAR2_API_KEY"] = KEY  # the proxy passes it on; only the completions are refused
        try:
            for args in clients(url, tiny_dir, tmp_path):
                env = {**os.environ}
                run = subprocess.run(
                    [*RSTAR2, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
                )
                said = " ".join((run.stdout + run.stderr).split())
                assert run.returncode == 1 and "answered 403" in said, (args, said[-2000:])
                assert error_lines(run) == 1 and "Traceback" not in said, (args, said[-2000:])
        finally:
            del os.environ["RSTAR2_API_KEY"]


def test_no_server_there(tiny_dir, tmp_path):
    for args in clients(f"http://127.0.0.1:{free_port()}", tiny_dir, tmp_path):
        said_once(args, 1, "ConnectError")


def test_a_redis_url_that_is_not_redis(keyed):
    """An HTTP port, and a plain TCP listener that answers a line of its own: the worker stops at
    once (retrying would never succeed) instead of a traceback."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        for url in (keyed.replace("http://", "redis://") + "/0", f"redis://127.0.0.1:{port}/0"):
            args = ["sandbox", "worker", "--redis", url, "--workers", "1", "--preload", "math"]
            said_once(args, 2, "is not a Redis server")
    finally:
        listener.close()

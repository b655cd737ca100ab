"""Every road past the laptop, end to end through the real CLI: RL and SFT under torchrun, RL on a
remote engine (`rstar2 serve`) whose weights must follow the trainer's, RL on the remote code
environment (the HTTP service, alone and with a Redis worker node), a recipe on a remote engine,
and failures that must stop a run with the first error and where it happened."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from safetensors.torch import load_file

from rstar2.engines.base import weights_fingerprint
from rstar2.rl.run.checkpoint import latest_checkpoint
from rstar2.rl.run.metrics_log import read_metrics

from ..conftest import ROOT, free_port, proxy, serve_model, start_cli, stop, wait_http
from .test_async import assert_versions_in_bound
from .test_trainer import FP32, place, rl_config

_PATH = os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")) if p)


def env() -> dict[str, str]:
    """The CLI's environment: this process's as it is now (a test's API key, for one), one thread."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": _PATH}


def cli(args: list[str], timeout: float = 600, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rstar2", *args],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def torchrun(n: int, args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n)]
    return subprocess.run(
        [*cmd, "-m", "rstar2", *args], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout
    )


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def write_config(tree: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(tree))
    return path


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(latest_checkpoint(run) / "model.safetensors"))


def assert_same_weights(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= atol, worst


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale")
    rows = [{"problem": f"What is {i} * {i + 1}?", "answer": str(i * (i + 1))} for i in range(12)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "train.jsonl"


def small_rl(model: Path, data: Path, out: Path, steps: int = 2, **rollout) -> dict:
    tree = rl_config(model, data, out)
    tree["run"].update(steps=steps, save_every=1, samples_per_step=8)
    return place(tree, **rollout)


# -- a remote engine --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def other_weights(tiny, tmp_path_factory) -> Path:
    """The tiny model with other weights than the runs start from: what a server holds when it
    served another run, or this run past the checkpoint it resumes from."""
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("other-weights")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def serve_tiny(model_dir: Path, weights_from: Path):
    """``rstar2 serve`` on ``model_dir`` in its own process, loading weights from under
    ``weights_from``: yields its URL, stops it after."""
    yield from serve_model(model_dir, "--device", "cpu", "--weights-from", str(weights_from), env=env())


@pytest.fixture
def served(other_weights, tmp_path_factory):
    yield from serve_tiny(other_weights, tmp_path_factory.getbasetemp())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rl_on_a_served_engine_keeps_the_server_on_the_trainers_weights(served, tiny_dir, problems, tmp_path):
    start = httpx.get(served + "/get_server_info").json()
    out = tmp_path / "run"
    tree = small_rl(tiny_dir, problems, out, servers=[served])
    tree["run"]["keep_steps"] = True
    ok(cli(["train", str(write_config(tree, tmp_path / "rl.yaml"))]))
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    # each step redone from what it kept (the server's tokens and log-probs) is the run's, bit for bit
    ok(cli(["replay", str(out), "--from", "1", "--to", "2"]))
    # after each update the server sampled with the trainer's weights: its logprobs are the trainer's
    assert all(r["sync/logprob_diff"] < 1e-4 for r in rows), [r["sync/logprob_diff"] for r in rows]
    info = httpx.get(served + "/get_server_info").json()
    assert info["weights_version"] == 2 and info["weights_loads"] == 3  # the run's start, then each step
    final = final_weights(out)
    assert info["weights_fingerprint"] == pytest.approx(weights_fingerprint(final), rel=1e-12)
    assert start["weights_fingerprint"] != pytest.approx(info["weights_fingerprint"], rel=1e-9)  # they moved


@pytest.fixture
def second_server(other_weights, tmp_path_factory):
    yield from serve_tiny(other_weights, tmp_path_factory.getbasetemp())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_versioned_weight_update_reaches_two_served_engines_mid_generation(
    served, second_server, tiny_dir, tmp_path
):
    """New weights pushed while each server decodes a long request: the requests are neither lost
    nor restarted, and each says which version sampled each of its tokens."""
    import concurrent.futures

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "new")
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 1500, "temperature": 1.0, "seed": 1, "ignore_eos": True}
    body |= {"logprobs": 0, "return_token_ids": True}

    def long_request(url: str) -> dict:
        return httpx.post(url + "/v1/completions", json=body, timeout=300).json()["choices"][0]

    urls = [served, second_server]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        running = [pool.submit(long_request, u) for u in urls]
        for u in urls:  # each server is decoding its request before the load
            deadline = time.monotonic() + 120
            while httpx.get(u + "/get_server_info").json()["engine"]["steps"] < 20:
                assert time.monotonic() < deadline, f"{u} never started decoding"
                time.sleep(0.01)
        for u in urls:
            r = httpx.post(
                u + "/update_weights_from_disk",
                json={"model_path": str(tmp_path / "new"), "weight_version": "5"},
                timeout=120,
            )
            assert r.status_code == 200 and r.json()["success"], r.text
        choices = [f.result() for f in running]
    for u, choice in zip(urls, choices, strict=True):
        versions = choice["token_versions"]
        assert len(choice["token_ids"]) == len(versions) == 1500, u
        # before the first load a server says no version (-1: what it serves is not a trainer's)
        assert versions[0] == -1 and versions[-1] == 5, (u, versions[:3], versions[-3:])
        first_new = versions.index(5)
        assert set(versions[:first_new]) == {-1} and set(versions[first_new:]) == {5}, u
        info = httpx.get(u + "/get_server_info").json()
        assert info["weights_version"] == info["engine"]["policy_version"] == 5 and info["weights_loads"] == 1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_asynchronous_rl_on_two_served_engines(served, second_server, tiny_dir, problems, tmp_path):
    """asynchronous.max_staleness 1 through the CLI with two `rstar2 serve` engines: every step once,
    the servers end on the trainer's weights, and every trained token is at most one update old
    (the servers say which version sampled it)."""
    out = tmp_path / "run"
    tree = small_rl(tiny_dir, problems, out, steps=3, servers=[served, second_server], max_staleness=1)
    tree["loss"] = {"tis_cap": 2.0}
    tree["rollout"]["top_k"] = 0  # the correction's mu is the untruncated distribution
    tree["run"]["keep_steps"] = True
    ok(cli(["train", str(write_config(tree, tmp_path / "rl.yaml"))]))
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    ok(cli(["replay", str(out), "--from", "1", "--to", "3"]))  # k = 1 on servers: bit for bit
    assert all(r["sync/logprob_diff"] < 1e-4 for r in rows)
    final = final_weights(out)
    for url in (served, second_server):
        info = httpx.get(url + "/get_server_info").json()
        assert info["weights_version"] == 3
        assert info["weights_fingerprint"] == pytest.approx(weights_fingerprint(final), rel=1e-12)
    assert_versions_in_bound(out, k=1)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_runs_on_one_server_holding_other_weights_train_only_their_own_policys_tokens(
    served, tiny_dir, problems, tmp_path
):
    """A server started on other weights than the run's; an asynchronous run (k = 1) on it killed
    with kill -9 and resumed (the server then holds weights from after the checkpoint), then a second
    run on the same server: each sends its starting weights and version before its first group, so
    no step trains on another policy's tokens, and the server ends on the last run's weights."""
    from .test_trainer import train_until_killed

    def tree_of(out: Path, steps: int) -> dict:
        tree = small_rl(tiny_dir, problems, out, steps=steps, servers=[served], max_staleness=1)
        tree["loss"] = {"tis_cap": 2.0}
        tree["rollout"]["top_k"] = 0  # the correction's mu is the untruncated distribution
        return tree

    first, second = tmp_path / "first", tmp_path / "second"
    config = write_config(tree_of(first, 5), tmp_path / "first.yaml")
    train_until_killed(config, first)
    killed_at = latest_checkpoint(first).name
    ok(cli(["train", str(config), "--resume"]))
    assert [r["step"] for r in read_metrics(first / "metrics.jsonl")] == [1, 2, 3, 4, 5], killed_at
    ok(cli(["train", str(write_config(tree_of(second, 2), tmp_path / "second.yaml"))]))
    for run in (first, second):
        assert_versions_in_bound(run, k=1)
        # a step trained only on tokens of its own version (each run's first, the resumed one's
        # first): the server sampled with the trainer's weights, not those it held before
        fresh = [r for r in read_metrics(run / "metrics.jsonl") if r["staleness/max"] == 0 and "loss" in r]
        assert fresh and all(r["update/engine_gap"] < 1e-4 for r in fresh), [
            (r["step"], r["update/engine_gap"]) for r in fresh
        ]
    info = httpx.get(served + "/get_server_info").json()
    assert info["weights_version"] == 2
    assert info["weights_fingerprint"] == pytest.approx(weights_fingerprint(final_weights(second)), rel=1e-12)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_server_that_reports_no_version_in_the_first_step_has_none_of_its_tokens_trained(
    served, tiny_dir, problems, tmp_path
):
    """At k = 1 the first step's bound would reach below version 0: the server (behind a proxy)
    says -1 for every token until the trainer has loaded weights into it a second time; those
    tokens fail it instead of training, it is revived on the current weights, and the run goes on."""
    loads: list[dict] = []

    def count(path: str, asked: dict) -> None:
        if path == "update_weights_from_disk":
            loads.append(asked)

    def unversioned(path: str, answer: dict) -> dict:
        if path == "v1/completions" and len(loads) < 2:
            for choice in answer["choices"]:
                choice["token_versions"] = [-1] * len(choice["token_versions"])
        return answer

    out = tmp_path / "run"
    with proxy(served, intercept=count, rewrite=unversioned) as url:
        tree = small_rl(tiny_dir, problems, out, steps=3, servers=[url], max_staleness=1, top_k=0)
        tree["loss"] = {"tis_cap": 2.0}
        run = cli(["train", str(write_config(tree, tmp_path / "rl.yaml"))])
    ok(run)
    said = " ".join(run.stderr.split())
    assert f"engine {url} failed" in said and f"engine {url} is back" in said, said[-3000:]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]
    assert all(r["staleness/unreported_tokens"] == 0 for r in read_metrics(out / "metrics.jsonl"))
    assert_versions_in_bound(out, k=1)


class RestartableServer:
    """``rstar2 serve`` on a fixed port that a test kills (SIGKILL: a crash) and starts again, as a
    process manager would: it comes back on its starting weights and says no version."""

    def __init__(self, model_dir: Path, weights_from: Path, wait: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["serve", "--model", str(model_dir), "--port", str(self.port), "--device", "cpu"]
        self.args += ["--weights-from", str(weights_from)]
        self.proc = None
        self.start(wait)

    def start(self, wait: bool = True) -> None:
        self.proc = start_cli(self.args, env=env())
        if wait:
            wait_http(self.url, self.proc)

    @classmethod
    def two(cls, model_dir: Path, weights_from: Path) -> tuple[RestartableServer, RestartableServer]:
        """Two servers started side by side, both answering."""
        a, b = cls(model_dir, weights_from, wait=False), cls(model_dir, weights_from, wait=False)
        for server in (a, b):
            wait_http(server.url, server.proc)
        return a, b

    def crash_while_sampling(self, run: Path, after_step: int, timeout: float = 300) -> None:
        """Kill it once the run has logged ``after_step`` and the next step's rollouts are on it."""
        deadline = time.monotonic() + timeout
        metrics = run / "metrics.jsonl"
        while not (metrics.exists() and len(read_metrics(metrics)) >= after_step):
            assert time.monotonic() < deadline, "the run never reached the step"
            time.sleep(0.05)
        while httpx.get(self.url + "/health").json()["in_flight"] == 0:
            assert time.monotonic() < deadline, "no rollout reached the server"
            time.sleep(0.005)
        self.proc.kill()
        self.proc.wait()


def train_in_background(config: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rstar2", "train", str(config)],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def long_rollouts(tree: dict) -> dict:
    """Rollouts of 48 tokens (the server decodes a while: a crash falls mid-step), a publish that
    waits through a server's restart (5 retries, 31 s)."""
    tree["rollout"]["max_response_tokens"] = 48
    tree["rollout"]["engine"]["reload_retries"] = 5
    return tree


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_server_restarted_mid_run_serves_again_only_once_it_holds_the_trainers_weights(
    other_weights, tiny_dir, problems, tmp_path, tmp_path_factory
):
    """The server crashes while it samples step 2 and comes back on its starting weights (other
    than the run's), labelled with no version: its tokens are never trained on; the trainer loads
    its current weights into it, checked, before it serves the run again; the run goes on."""
    server = RestartableServer(other_weights, tmp_path_factory.getbasetemp())
    out = tmp_path / "run"
    tree = long_rollouts(small_rl(tiny_dir, problems, out, steps=4, servers=[server.url]))
    train = train_in_background(write_config(tree, tmp_path / "rl.yaml"))
    try:
        server.crash_while_sampling(out, after_step=1)
        server.start()
        _, err = train.communicate(timeout=600)
        info = httpx.get(server.url + "/get_server_info").json()
    finally:
        train.kill()
        stop(server.proc)
    assert train.returncode == 0, err[-3000:]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert_versions_in_bound(out, k=0)  # no token without a reported version, none but the trainer's
    said = " ".join(err.split())
    assert f"engine {server.url} failed" in said and f"engine {server.url} is back" in said, said[-3000:]
    # since its restart it loaded the trainer's weights (the revival, then each publish) and holds the last
    assert info["weights_version"] == 4 and info["weights_loads"] >= 2
    assert info["weights_fingerprint"] == pytest.approx(weights_fingerprint(final_weights(out)), rel=1e-12)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_server_that_dies_for_good_stops_the_step_saying_which(
    other_weights, tiny_dir, problems, tmp_path, tmp_path_factory
):
    """Its rollouts are neither dropped nor trained on short: the step stops, naming the server."""
    server = RestartableServer(other_weights, tmp_path_factory.getbasetemp())
    out = tmp_path / "run"
    tree = long_rollouts(small_rl(tiny_dir, problems, out, steps=3, servers=[server.url]))
    tree["rollout"]["engine"]["reload_retries"] = 0
    tree["rollout"]["scheduler"] = {"revive_for_s": 3}
    train = train_in_background(write_config(tree, tmp_path / "rl.yaml"))
    try:
        server.crash_while_sampling(out, after_step=1)
        _, err = train.communicate(timeout=600)
    finally:
        train.kill()
        stop(server.proc)
    assert train.returncode == 1, err[-3000:]
    said = " ".join(err.split())
    assert re.search(
        rf"RL step 2 failed: \S+: \d+ of \d+ rollouts lost their engine.*{re.escape(server.url)}", said
    ), said[-3000:]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1]
    assert not (out / "samples" / "step_000002.jsonl").exists()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_of_two_servers_one_crashes_the_run_goes_on_and_it_returns_on_current_weights(
    tiny_dir, problems, tmp_path, tmp_path_factory
):
    """Server a is killed while it samples step 2 and started again: meanwhile its turns go to b,
    and the steps' weights are published to b alone (a is out of rotation; no reload retries to
    wait its restart through); once a is up the trainer loads the current weights into it before
    it serves again."""
    a, b = RestartableServer.two(tiny_dir, tmp_path_factory.getbasetemp())
    out = tmp_path / "run"
    tree = long_rollouts(small_rl(tiny_dir, problems, out, steps=20, servers=[a.url, b.url]))
    tree["rollout"]["engine"]["reload_retries"] = 0
    log = tmp_path / "train.log"
    with log.open("w") as fh:
        train = subprocess.Popen(
            [sys.executable, "-m", "rstar2", "train", str(write_config(tree, tmp_path / "rl.yaml"))],
            cwd=ROOT,
            env=env(),
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        a.crash_while_sampling(out, after_step=1)
        a.start()  # the steps go on meanwhile (a step takes a second or two, a start several)
        train.wait(timeout=600)
        info = httpx.get(a.url + "/get_server_info").json()
    finally:
        train.kill()
        stop(a.proc), stop(b.proc)
    said = " ".join(log.read_text().split())
    assert train.returncode == 0, said[-3000:]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert_versions_in_bound(out, k=0)
    assert f"engine {a.url} failed" in said and f"engine {a.url} is back" in said, said[-3000:]
    assert info["weights_version"] == 20  # revived on the current weights, then each publish
    assert info["weights_loads"] < 20  # the publishes while it was down went to b alone
    assert info["weights_fingerprint"] == pytest.approx(weights_fingerprint(final_weights(out)), rel=1e-12)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_of_two_servers_one_dead_at_the_start_the_run_goes_on_on_the_other(
    tiny_dir, problems, tmp_path, tmp_path_factory
):
    """An engine node lost before a run (or a recipe's next stage) starts: the server that does not
    take the first weights leaves the rotation, said; the other samples every step."""
    a, b = RestartableServer.two(tiny_dir, tmp_path_factory.getbasetemp())
    stop(a.proc)
    out = tmp_path / "run"
    tree = small_rl(tiny_dir, problems, out, steps=2, servers=[a.url, b.url])
    tree["rollout"]["engine"]["reload_retries"] = 0
    try:
        run = cli(["train", str(write_config(tree, tmp_path / "rl.yaml"))])
    finally:
        stop(b.proc)
    said = " ".join(run.stderr.split())
    assert run.returncode == 0, said[-3000:]
    assert f"engine {a.url} failed (it did not take the weights of version 0" in said, said[-3000:]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]
    sampled = [json.loads(x) for f in (out / "samples").glob("*.jsonl") for x in f.read_text().splitlines()]
    assert {t["turns"][0]["engine"] for t in sampled} == {b.url}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_both_servers_dead_stops_the_step_naming_both(tiny_dir, problems, tmp_path, tmp_path_factory):
    a, b = RestartableServer.two(tiny_dir, tmp_path_factory.getbasetemp())
    out = tmp_path / "run"
    tree = long_rollouts(small_rl(tiny_dir, problems, out, steps=3, servers=[a.url, b.url]))
    tree["rollout"]["engine"]["reload_retries"] = 0
    tree["rollout"]["scheduler"] = {"revive_for_s": 3}
    train = train_in_background(write_config(tree, tmp_path / "rl.yaml"))
    try:
        a.crash_while_sampling(out, after_step=1)
        b.proc.kill()
        _, err = train.communicate(timeout=600)
    finally:
        train.kill()
        stop(a.proc), stop(b.proc)
    said = " ".join(err.split())
    assert train.returncode == 1, said[-3000:]
    stopped = re.search(r"error: RL step 2 failed: .*rollouts lost their engine.*", said)
    assert stopped and a.url in stopped[0] and b.url in stopped[0], said[-3000:]  # each named
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_refused_weight_update_stops_the_run_saying_where(served, tiny_dir, problems, tmp_path):
    out = tmp_path / "run"
    tree = small_rl(tiny_dir, problems, out, servers=[served], reload_path="/no_such_route", reload_retries=1)
    run = cli(["train", str(write_config(tree, tmp_path / "rl.yaml"))])
    assert run.returncode == 1, run.stderr[-3000:]
    said = " ".join(run.stderr.split())
    # the run's own weights go first, before any rollout: nothing sampled on the server's weights
    assert "RL start failed: WeightSyncError" in said and f"engine {served} refused the new weights" in said
    assert "Traceback" not in run.stderr and "metrics.jsonl" not in said  # the first error, nothing after it
    assert "WeightSyncError" in (out / "error.txt").read_text()
    assert (out / "config.yaml").is_file() and not (out / "samples").exists()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_server_that_loads_no_weights_stops_the_run_with_its_own_words(tiny_dir, problems, tmp_path):
    """``rstar2 serve`` started without ``--weights-from`` answers why it refuses; the trainer says it."""
    port = free_port()
    args = ["serve", "--model", str(tiny_dir), "--port", str(port), "--device", "cpu"]
    proc = start_cli(args, env=env())
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url, proc)
        tree = small_rl(tiny_dir, problems, tmp_path / "run", servers=[url], reload_retries=0)
        run = cli(["train", str(write_config(tree, tmp_path / "rl.yaml"))])
    finally:
        stop(proc)
    said = " ".join(run.stderr.split())
    assert run.returncode == 1 and "RL start failed: WeightSyncError" in said, said[-3000:]
    assert "this server was started without --weights-from" in said, said[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_dead_engine_stops_the_run_naming_it(tiny_dir, problems, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "run"
    tree = small_rl(tiny_dir, problems, out, servers=[dead], retries=0)
    run = cli(["train", str(write_config(tree, tmp_path / "rl.yaml"))])
    assert run.returncode == 1, run.stderr[-3000:]
    said = " ".join(run.stderr.split())
    # the run's weights go to the engine first: a dead one stops the run there, before any rollout
    assert "RL start failed: WeightSyncError" in said and f"engine {dead} refused" in said, said
    assert not latest_checkpoint(out) and not (out / "samples").exists()  # nothing sampled or trained


# -- several training processes ---------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("batch_size", [4, 1], ids=["4-problems", "fewer-problems-than-processes"])
def test_rl_under_torchrun_ends_with_the_parameters_of_one_process(tiny_dir, problems, tmp_path, batch_size):
    runs = {}
    for n in (1, 2):
        out = tmp_path / f"n{n}"
        tree = small_rl(tiny_dir, problems, out)
        tree["run"]["batch_size"] = batch_size
        tree["optim"]["lr"] = 1e-3
        tree["roc"]["refill_groups"] = 2  # groups without a spread refilled: the same draws on each process
        path = write_config(tree, tmp_path / f"n{n}.yaml")
        ok(cli(["train", str(path)]) if n == 1 else torchrun(2, ["train", str(path)]))
        runs[n] = out
    one, two = read_metrics(runs[1] / "metrics.jsonl"), read_metrics(runs[2] / "metrics.jsonl")
    for a, b in zip(one, two, strict=True):  # the same rollouts, rewards and RoC choices
        for key in ("reward/mean", "rollouts_kept", "response/length_mean", "groups/refilled", "roc/groups"):
            assert a[key] == pytest.approx(b[key], abs=1e-9), (a["step"], key)
    start = load_file(str(tiny_dir / "model.safetensors"))
    moved = max(float((final_weights(runs[1])[k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-4
    assert_same_weights(final_weights(runs[1]), final_weights(runs[2]), atol=moved / 100)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_asynchronous_rl_under_torchrun(tiny_dir, problems, tmp_path):
    """asynchronous.max_staleness 1 with two training processes, each generating its own groups on its
    own engine copy while the update runs: every step once, every trained token at most one update
    old, each engine on the trainer's weights after every sync."""
    out = tmp_path / "run"
    tree = small_rl(tiny_dir, problems, out, steps=3, max_staleness=1)
    tree["run"]["batch_size"] = 4
    tree["loss"] = {"tis_cap": 2.0}
    tree["rollout"]["top_k"] = 0  # the correction's mu is the untruncated distribution
    tree["run"]["keep_steps"] = True
    ok(torchrun(2, ["train", str(write_config(tree, tmp_path / "rl.yaml"))]))
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["staleness/max"] <= 1 for r in rows)
    # each process kept its part of every step (its shards' fingerprints); a replay says it cannot
    kept = sorted(p.name for p in (out / "kept").iterdir())
    assert kept == [f"step_{s:06d}{r}.json.gz" for s in (1, 2, 3) for r in ("", ".rank1")]
    refused = cli(["replay", str(out), "--step", "1"])
    assert refused.returncode == 2 and "replay redoes runs of one process" in " ".join(refused.stderr.split())
    # each process's engine copy is compared exactly with what was sent (no probe in its batch)
    assert all("sync/logprob_diff" not in r for r in rows)
    assert any(r["staleness/max"] == 1 for r in rows[1:])  # later steps' groups ran beside an update
    assert_versions_in_bound(out, k=1)
    start = load_file(str(tiny_dir / "model.safetensors"))
    assert max(float((final_weights(out)[k] - start[k]).abs().max()) for k in start) > 1e-6


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("lora", [None, {"rank": 4}], ids=["every-weight", "adapter"])
def test_sft_under_torchrun_ends_with_the_parameters_of_one_process(tiny_dir, tmp_path, lora):
    """Two processes train what one would: every weight, or an adapter (``model.lora``) over a
    frozen base that FSDP2 shards alike."""
    from rstar2.adapters import ADAPTER_WEIGHTS

    from .test_sft import conversation

    def trained(run: Path) -> dict[str, torch.Tensor]:
        return load_file(str(latest_checkpoint(run) / ADAPTER_WEIGHTS)) if lora else final_weights(run)

    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"messages": conversation(a, 7)}) + "\n" for a in range(2, 9)))
    runs = {}
    for n in (1, 2):
        out = tmp_path / f"n{n}"
        tree = {
            "kind": "sft",
            "chat": {"system_prompt": "Answer.", "tools_in_prompt": False},
            "model": {"path": str(tiny_dir), "threads": 1, **FP32, **({"lora": lora} if lora else {})},
            "data": {"train": str(data)},
            "optim": {"lr": 1e-2 if lora else 1e-3, "warmup_steps": 0},
            "run": {"out": str(out), "steps": 3, "batch_size": 3, "progress": False},
        }
        path = write_config(tree, tmp_path / f"sft{n}.yaml")
        ok(cli(["train", str(path)]) if n == 1 else torchrun(2, ["train", str(path)]))
        runs[n] = out
    one, two = read_metrics(runs[1] / "metrics.jsonl"), read_metrics(runs[2] / "metrics.jsonl")
    assert [r["loss"] for r in one] == pytest.approx([r["loss"] for r in two], rel=1e-4)
    if lora:  # lora_B starts at zero: how far it went is how far the adapter moved
        moved = max(float(t.abs().max()) for k, t in trained(runs[1]).items() if "lora_B" in k)
    else:
        start = load_file(str(tiny_dir / "model.safetensors"))
        moved = max(float((trained(runs[1])[k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-4
    assert_same_weights(trained(runs[1]), trained(runs[2]), atol=moved / 100)


# -- the remote code environment --------------------------------------------------------------
def sandbox_calls(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith("rstar2_sandbox_calls_total"))


def tool_statuses(run: Path) -> list[str]:
    rows = [
        json.loads(x) for f in sorted((run / "samples").glob("*.jsonl")) for x in f.read_text().splitlines()
    ]
    return [c["result"]["status"] for r in rows for t in r["turns"] for c in t["calls"] if c["result"]]


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["http", "redis"])
def test_rl_on_the_remote_code_environment(tool_caller, problems, tmp_path, mode, redis_server):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = ["sandbox", "serve", "--port", str(port), "--workers", "1"]
    procs = []
    try:
        if mode == "redis":  # the service enqueues to Redis; a worker node runs the calls
            serve += ["--redis", redis_server.url]
            procs.append(
                start_cli(["sandbox", "worker", "--redis", redis_server.url, "--workers", "1"], env=env())
            )
        procs.append(start_cli(serve, env=env()))
        wait_http(url, procs[-1])
        out = tmp_path / "run"
        tree = small_rl(
            tool_caller, problems, out, sandbox=url, max_response_tokens=120, max_turns=2, top_k=1
        )
        ok(cli(["train", str(write_config(tree, tmp_path / "rl.yaml"))]))
        statuses = tool_statuses(out)
        assert statuses and "internal" not in statuses, statuses  # every call was run, remotely
        assert sandbox_calls(url) >= len(statuses)
    finally:
        for p in procs:
            stop(p)

"""`rstar2 launch --on local`, whole through the CLI: a trainer node and engine nodes on this
machine, wired (the key, Redis's password, every URL) and checked before the first step; and the
launch failures, each a named error within its deadline, leaving no process behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

from rstar2.config import ClusterSection
from rstar2.launch.plan import ENGINE, REDIS, port
from rstar2.rl.run.checkpoint import latest_checkpoint

from ..conftest import ROOT
from .conftest import cli_env, finished, launch, launch_config, launched, none_left, run_id, wait_for


def engines_sampled(run) -> set[str]:
    rows = [json.loads(x) for f in (run / "samples").glob("*.jsonl") for x in f.read_text().splitlines()]
    return {t["turns"][0]["engine"] for t in rows}


def test_a_run_on_a_trainer_node_and_an_engine_node(tiny_dir, problems, tmp_path):
    """Every role starts with its log, the trainer samples only on the engine node, the key and the
    password reach the services through their environment alone, and nothing outlives the run."""
    config = launch_config(tiny_dir, problems, tmp_path)
    proc = launch([str(config), "--on", "local"])
    run = tmp_path / "run"
    trainer_log = run / "launch" / "attempt-1" / "node0-trainer.log"
    wait_for(lambda: trainer_log.exists(), 120, "the trainer started")
    rid = run_id(run)
    secrets = set()
    for pid in launched(rid):  # while it runs: every process has the secrets in its environment only
        try:
            environ = dict(
                x.split(b"=", 1) for x in open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if b"=" in x
            )
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        for name in (b"RSTAR2_API_KEY", b"RSTAR2_REDIS_PASSWORD"):
            if name in environ:
                secrets.add(environ[name])
                assert environ[name] not in cmdline, (pid, cmdline)
    code, out = finished(proc)
    assert code == 0, out
    assert len(secrets) == 2  # one key, one password, shared by every process that has them
    logs = {p.name for p in (run / "launch" / "attempt-1").glob("*.log")}
    assert logs >= {
        "node0.log",
        "node0-redis.log",
        "node0-sandbox.log",
        "node0-worker.log",
        "node0-trainer.log",
    }
    assert logs >= {"node1.log", "node1-engine-0.log", "node1-worker.log"}
    for f in (run / "launch").rglob("*"):
        if f.is_file():
            assert not any(s in f.read_bytes() for s in secrets), f
    base = ClusterSection.model_validate(
        json.loads((run / "launch" / "attempt-1" / "plan.json").read_text())["tree"]["cluster"]
    )
    assert engines_sampled(run) == {f"http://127.0.0.1:{port(base, 1, ENGINE)}"}
    assert (run / "checkpoints" / "step-000002").is_dir()
    assert not none_left(rid)


def test_a_port_taken_is_named_and_nothing_is_left(tiny_dir, problems, tmp_path):
    config = launch_config(tiny_dir, problems, tmp_path)
    cluster = ClusterSection.model_validate(__import__("yaml").safe_load(config.read_text())["cluster"])
    taken = port(cluster, 0, REDIS)
    with socket.socket() as holder:
        holder.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # a TIME_WAIT of an earlier run is no owner
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        code, out = finished(launch([str(config), "--on", "local"]), 120)
    assert code == 1, out
    assert f"port {taken} for its redis is taken" in out and "node 0 (head" in out, out
    assert not none_left(run_id(tmp_path / "run"))


def node(config_run, rank: int, hosts: str, prefix: list[str] = (), **kw) -> subprocess.Popen:
    """``rstar2 launch-node`` started by hand, as a road starts it (``prefix``: a node that differs)."""
    args = [
        sys.executable,
        "-m",
        "rstar2",
        "launch-node",
        "--rank",
        str(rank),
        "--hosts",
        hosts,
        "--plan",
        str(config_run),
    ]
    return subprocess.Popen(
        [*prefix, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw
    )


def plan_file(config, tmp_path) -> tuple:
    from rstar2.launch.plan import new_plan

    plan = new_plan(config, [])
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    return plan, path


def secret_env(plan) -> dict[str, str]:
    from rstar2.launch.plan import RUN_ENV
    from rstar2.launch.roads import run_secrets

    return {**cli_env(), **run_secrets(), RUN_ENV: plan.run_id}


def test_a_node_that_never_joins_is_named_at_its_deadline(tiny_dir, problems, tmp_path):
    config = launch_config(tiny_dir, problems, tmp_path, start_timeout_s=8)
    plan, path = plan_file(config, tmp_path)
    head = node(path, 0, "127.0.0.1,127.0.0.1", env=secret_env(plan))  # node 1 never starts
    out, _ = head.communicate(timeout=120)
    assert head.returncode == 1, out
    assert "not every node joined within 8 s: node 1 missing" in out and "node1.log" in out, out
    assert not none_left(plan.run_id)


def test_a_run_folder_that_is_not_shared_is_named_by_the_canary(tiny_dir, problems, tmp_path):
    """Node 1 runs in a mount namespace of its own, its run folder another filesystem (a tmpfs):
    with shared_fs it must say the folder is not shared, before any engine starts."""
    config = launch_config(tiny_dir, problems, tmp_path, start_timeout_s=10)
    plan, path = plan_file(config, tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    apart = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount -t tmpfs none "{run}" && exec "$@"',
        "-",
    ]
    hosts, both = "127.0.0.1,127.0.0.1", secret_env(plan)
    head = node(path, 0, hosts, env=both)
    other = node(path, 1, hosts, prefix=apart, env=both)
    out1, _ = other.communicate(timeout=120)
    out0, _ = head.communicate(timeout=120)
    assert other.returncode == 1, out1
    assert "the run folder is not shared with the head" in out1 and "canary" in out1, out1
    assert head.returncode == 1 and "node 1 missing" in out0, out0
    assert not none_left(plan.run_id)


def test_an_engine_node_lost_mid_run_the_launcher_stopped_and_the_run_resumed(tiny_dir, problems, tmp_path):
    """Two engine nodes: one killed (its node process, SIGKILL) after the first step, the run goes
    on on the other; then the launcher is stopped (SIGTERM) mid-run: every process of the launch
    ends; launched again with --resume, the run goes on from its last checkpoint (attempt 2)."""
    config = launch_config(tiny_dir, problems, tmp_path, steps=40, nodes=3, engine_nodes=2)
    proc = launch([str(config), "--on", "local"])
    run = tmp_path / "run"
    metrics = run / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 1, 240, "the first step")
    rid = run_id(run)
    lost = int(subprocess.check_output(["pgrep", "-f", "launch-node --rank 2"], text=True).split()[0])
    os.kill(lost, signal.SIGKILL)
    steps = metrics.read_text().count("\n")
    wait_for(
        lambda: metrics.read_text().count("\n") >= steps + 2,
        240,
        "two more steps after the engine node was lost",
    )
    proc.send_signal(signal.SIGTERM)
    code, out = finished(proc, 120)
    assert code == 130, out
    assert "node 2 (engine) was lost" in out, out
    assert not none_left(rid)
    cluster = ClusterSection.model_validate(
        json.loads((run / "launch" / "attempt-1" / "plan.json").read_text())["tree"]["cluster"]
    )
    last = [json.loads(x) for x in sorted((run / "samples").glob("*.jsonl"))[-1].read_text().splitlines()]
    assert {t["turns"][0]["engine"] for t in last} == {f"http://127.0.0.1:{port(cluster, 1, ENGINE)}"}
    # launched again: refused without --resume, then on from the last checkpoint, as the next attempt
    code, out = finished(launch([str(config), "--on", "local"]), 60)
    assert code == 2 and "holds a run: pass --resume" in out, out
    saved = int(latest_checkpoint(run).name.split("-")[-1])
    code, out = finished(
        launch([str(config), "--on", "local", "--resume", "--set", f"run.steps={saved + 1}"])
    )
    assert code == 0, out
    assert "no checkpoint" not in (run / "launch" / "attempt-2" / "node0-trainer.log").read_text()
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()][-1] == saved + 1


def test_weights_over_http_reach_an_engine_node_that_shares_no_folder(tiny_dir, problems, tmp_path):
    """shared_fs: false. Node 1 sees neither the run folder nor the starting model (tmpfs over both,
    in a mount namespace of its own): it fetches the model from the head's weight service, and each
    update's weights are mirrored onto its disk, checked, before it loads them."""
    model = tmp_path / "model"
    __import__("shutil").copytree(tiny_dir, model)
    config = launch_config(model, problems, tmp_path, shared_fs=False)
    plan, path = plan_file(config, tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    hide = f'mount -t tmpfs none "{run}" && mount -t tmpfs none "{model}" && exec "$@"'
    apart = ["unshare", "--mount", "--propagation", "private", "sh", "-c", hide, "-"]
    hosts, both = "127.0.0.1,127.0.0.1", secret_env(plan)
    head = node(path, 0, hosts, env=both)
    other = node(path, 1, hosts, prefix=apart, env=both)
    out0, _ = head.communicate(timeout=300)
    out1, _ = other.communicate(timeout=60)
    assert head.returncode == 0 and other.returncode == 0, f"head: {out0}\nnode 1: {out1}"
    assert not (run / "launch" / "canary").exists()
    loads = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(m["sync/logprob_diff"] < 1e-3 for m in loads if "sync/logprob_diff" in m)
    assert engines_sampled(run) == {f"http://127.0.0.1:{launch_port(config, 1)}"}
    assert not none_left(plan.run_id)


def launch_port(config, rank: int) -> int:
    import yaml

    return port(ClusterSection.model_validate(yaml.safe_load(config.read_text())["cluster"]), rank, ENGINE)


def test_two_trainer_nodes_share_one_run_under_torchrun(tiny_dir, problems, tmp_path):
    """Three nodes: two train (torchrun across them, its rendezvous on the head's port), one serves."""
    config = launch_config(tiny_dir, problems, tmp_path, nodes=3, engine_nodes=1)
    code, out = finished(launch([str(config), "--on", "local"]))
    run = tmp_path / "run"
    logs = run / "launch" / "attempt-1"
    assert code == 0, out + (logs / "node1-trainer.log").read_text()[-3000:]
    assert "node1-trainer.log" in os.listdir(logs) and "node2-engine-0.log" in os.listdir(logs)
    assert (run / "checkpoints" / "step-000002").is_dir()
    assert engines_sampled(run) == {f"http://127.0.0.1:{launch_port(config, 2)}"}
    assert not none_left(run_id(run))


def test_the_launcher_killed_outright_leaves_nothing(tiny_dir, problems, tmp_path):
    """SIGKILL: the launcher says nothing to anyone, yet every node (its parent gone) stops its roles."""
    config = launch_config(tiny_dir, problems, tmp_path, steps=40)
    proc = launch([str(config), "--on", "local"])
    run = tmp_path / "run"
    wait_for(lambda: (run / "metrics.jsonl").exists(), 240, "the first step")
    rid = run_id(run)
    proc.kill()
    proc.wait()
    assert not none_left(rid, 60)

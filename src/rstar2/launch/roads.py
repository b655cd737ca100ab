"""Where the nodes of a launch run: processes of this machine (``local``), the tasks of a SLURM job,
or Ray tasks on a running Ray cluster. Placement is SLURM's or Ray's; each road only starts the
same ``rstar2 launch-node`` once a node, gives it the run's fresh secrets in its environment (never
on a command line, in the sbatch script or in a log), and ends them all when the head ends. An
engine node lost mid-run is said and the run goes on (the trainer takes its engines out of
rotation); any other node lost ends the launch."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..auth import KEY_ENV
from ..sandbox.redis_queue import PASSWORD_ENV
from . import plan as P
from .node import set_death_signal

TEMPLATE = Path(__file__).with_name("sbatch.sh.j2")


class LaunchError(RuntimeError):
    """The launch ended without the run finishing: which node, and why (its error line)."""


def run_secrets() -> dict[str, str]:
    """A fresh API key for every service and a fresh Redis password, for this launch only."""
    return {KEY_ENV: secrets.token_hex(24), PASSWORD_ENV: secrets.token_hex(24)}


def next_attempt(plan: P.Plan) -> int:
    return 1 + len(list((Path(plan.run_dir) / "launch").glob("attempt-*")))


def node_args(plan: P.Plan, plan_file: str | None, rank: str, hosts: str, attempt: str) -> list[str]:
    args = [
        plan.python,
        "-m",
        "rstar2",
        "launch-node",
        "--rank",
        rank,
        "--hosts",
        hosts,
        "--attempt",
        attempt,
    ]
    return args + (["--plan", plan_file] if plan_file else [])


def said_error(log: Path) -> str:
    """A node's last ``error:`` line, else the end of its log."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {log})"
    errors = [x for x in lines if x.startswith("error:")]
    return errors[-1][len("error: ") :] if errors else " | ".join(lines[-5:])


@dataclass
class NodeHandle:
    rank: int
    kind: str
    poll: Callable[[], int | None]
    stop: Callable[[], None]
    log: Path


def supervise(nodes: list[NodeHandle], say: Callable[[str], None]) -> int:
    """Until the head ends (its status), or a node that is not an engine node ends first."""
    lost: set[int] = set()
    try:
        while True:
            for node in nodes:
                code = node.poll()
                if code is None or node.rank in lost:
                    continue
                if node.rank == 0:
                    if code:
                        raise LaunchError(f"node 0 (head) ended ({code}): {said_error(node.log)}")
                    return 0
                if node.kind == "engine":
                    lost.add(node.rank)
                    say(
                        f"[rstar2] node {node.rank} (engine) was lost ({code}): the run goes on on the other engines"
                    )
                    continue
                raise LaunchError(f"node {node.rank} ({node.kind}) ended ({code}): {said_error(node.log)}")
            time.sleep(0.5)
    finally:
        for node in nodes:
            node.stop()


def stopped_by_signals() -> None:
    """SIGTERM ends the launch as Ctrl-C does: every node stopped, with its grace."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


# -- this machine ---------------------------------------------------------------------------------
def run_local(plan: P.Plan, attempt: int, say: Callable[[str], None]) -> int:
    """Every node a process of this machine on 127.0.0.1 (a workstation's GPUs shared out in order)."""
    cluster, logs = plan.cluster, Path(plan.run_dir) / "launch" / f"attempt-{attempt}"
    logs.mkdir(parents=True, exist_ok=True)
    plan_file = logs / "plan.json"
    plan_file.write_text(plan.to_json())
    hosts = ",".join(["127.0.0.1"] * cluster.nodes)
    env = {**os.environ, **run_secrets(), P.RUN_ENV: plan.run_id}
    gpus = env.get("CUDA_VISIBLE_DEVICES", "").split(",") if cluster.gpus_per_node else []
    nodes = []
    for rank in range(cluster.nodes):
        mine = gpus[rank * cluster.gpus_per_node : (rank + 1) * cluster.gpus_per_node]
        node_env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(mine)} if mine else env
        log = logs / f"node{rank}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                node_args(plan, str(plan_file), str(rank), hosts, str(attempt)),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=node_env,
                cwd=plan.cwd,
                preexec_fn=set_death_signal,
            )
        nodes.append(
            NodeHandle(rank, P.node_kind(cluster, rank), proc.poll, stopper(proc, cluster.grace_s), log)
        )
    say(f"[rstar2] {cluster.nodes} nodes on this machine; logs in {logs}")
    return supervise(nodes, say)


def stopper(proc: subprocess.Popen, grace_s: float) -> Callable[[], None]:
    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace_s + 15)  # the node gives its roles grace_s, then kills them
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    return stop


# -- SLURM ----------------------------------------------------------------------------------------
def sbatch_script(plan: P.Plan, attempt: int) -> str:
    """The job script: one task a node, each told its rank by ``SLURM_PROCID`` and the nodes'
    addresses by SLURM; the plan inside it (no file has to reach every node)."""
    import jinja2

    cluster = plan.cluster
    roles = [
        f"node {r}: {P.node_kind(cluster, r)}"
        + (
            f", engines on ports {P.port(cluster, r, P.ENGINE)}+"
            if P.node_kind(cluster, r) == "engine"
            else ""
        )
        for r in range(cluster.nodes)
    ]
    template = jinja2.Template(
        TEMPLATE.read_text(), keep_trailing_newline=True, undefined=jinja2.StrictUndefined
    )
    return template.render(
        plan=plan,
        cluster=cluster,
        roles=roles,
        attempt=attempt,
        logs=f"{plan.run_dir}/launch",
        node=" ".join(node_args(plan, None, "$RANK", '"$HOSTS"', '"$ATTEMPT"')),
        plan_env=P.PLAN_ENV,
        run_env=P.RUN_ENV,
    )


def write_sbatch(plan: P.Plan, attempt: int) -> Path:
    path = Path(plan.run_dir) / "launch" / "launch.sbatch"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(sbatch_script(plan, attempt))
    return path


def run_slurm(plan: P.Plan, script: Path, say: Callable[[str], None]) -> int:
    """Submit with the cluster's own ``sbatch --wait``; the launcher's end (Ctrl-C, SIGTERM) cancels
    the job, whose tasks get SIGTERM and SLURM's KillWait before SIGKILL."""
    env = {**os.environ, **run_secrets(), P.RUN_ENV: plan.run_id}  # sbatch exports them to the job
    proc = subprocess.Popen(
        ["sbatch", "--parsable", "--wait", str(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    job = (proc.stdout.readline() if proc.stdout else "").strip().split(";")[0]
    say(f"[rstar2] SLURM job {job}: {script}; logs in {Path(plan.run_dir) / 'launch'}")
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        if job:
            subprocess.run(["scancel", "--signal=TERM", "--full", job], env=env, check=False)
        proc.wait()
        raise
    if code:
        logs = sorted((Path(plan.run_dir) / "launch").glob("attempt-*/node*.log"))
        said = [
            f"{log.name}: {said_error(log)}" for log in logs if "error:" in log.read_text(errors="replace")
        ]
        raise LaunchError(f"SLURM job {job} ended ({code})" + (": " + "; ".join(said) if said else ""))
    return 0


# -- Ray ------------------------------------------------------------------------------------------
def run_ray(plan: P.Plan, attempt: int, address: str, say: Callable[[str], None]) -> int:
    """One Ray task a node, placed by a STRICT_SPREAD placement group (a bundle a node, its GPUs
    logical); the nodes' addresses are those Ray placed the bundles on."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    cluster = plan.cluster
    ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    gpu = {"GPU": cluster.gpus_per_node} if cluster.gpus_per_node else {}
    group = placement_group([{"CPU": 1, **gpu}] * cluster.nodes, strategy="STRICT_SPREAD")
    try:
        ready, _ = ray.wait([group.ready()], timeout=cluster.start_timeout_s)
        if not ready:
            alive = sum(1 for n in ray.nodes() if n["Alive"])
            raise LaunchError(
                f"Ray did not place {cluster.nodes} nodes within {cluster.start_timeout_s:.0f} s: the cluster at "
                f"{address} has {alive} alive nodes (a node a bundle of 1 CPU{f', {cluster.gpus_per_node} GPUs' if gpu else ''})"
            )
        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        placed = placement_group_table(group)["bundles_to_node_id"]
        hosts = ",".join(ips[placed[r]] for r in range(cluster.nodes))
        secrets_env = {**run_secrets(), P.RUN_ENV: plan.run_id}
        # a task whose node dies fails at once (NodeDiedError), not retried: its bundle would wait to be
        # placed again, which a STRICT_SPREAD group short of a node never is
        node = ray.remote(max_retries=0)(run_node_task)
        refs, nodes = [], []
        for rank in range(cluster.nodes):
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)
            options = {"num_cpus": 1, "num_gpus": cluster.gpus_per_node, "scheduling_strategy": strategy}
            ref = node.options(**options).remote(plan.to_json(), rank, hosts, attempt, secrets_env)
            refs.append(ref)
            nodes.append(
                NodeHandle(
                    rank,
                    P.node_kind(cluster, rank),
                    ray_poll(ref),
                    ray_stop(ref),
                    log_of(plan, attempt, rank),
                )
            )
        say(
            f"[rstar2] {cluster.nodes} nodes placed by Ray at {address} ({hosts}); logs in {log_of(plan, attempt, 0).parent}"
        )
        return supervise(nodes, say)
    finally:
        remove_placement_group(group)
        ray.shutdown()


def log_of(plan: P.Plan, attempt: int, rank: int) -> Path:
    return Path(plan.run_dir) / "launch" / f"attempt-{attempt}" / f"node{rank}.log"


def ray_poll(ref) -> Callable[[], int | None]:
    import ray

    def poll() -> int | None:
        done, _ = ray.wait([ref], timeout=0)
        if not done:
            return None
        try:
            return int(ray.get(ref))
        except Exception:  # noqa: BLE001 - a lost node or a killed task: its own log says more
            return -1

    return poll


def ray_stop(ref) -> Callable[[], None]:
    import ray

    def stop() -> None:
        ray.cancel(ref, force=True)  # its worker process ends; the node process gets SIGTERM (death signal)

    return stop


def run_node_task(plan_json: str, rank: int, hosts: str, attempt: int, env: dict[str, str]) -> int:
    """A Ray task: this node's ``rstar2 launch-node``, its log in the run folder as it sees it."""
    plan = P.Plan.from_json(plan_json)
    log = log_of(plan, attempt, rank)
    log.parent.mkdir(parents=True, exist_ok=True)
    child_env = {**os.environ, **env, P.PLAN_ENV: plan_json}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            node_args(plan, None, str(rank), hosts, str(attempt)),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env,
            cwd=plan.cwd if Path(plan.cwd).is_dir() else None,
            start_new_session=True,  # out of the worker's process group, killed outright on a cancel:
            preexec_fn=set_death_signal,  # the worker's end is a SIGTERM, and the node stops in order
        )
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait()

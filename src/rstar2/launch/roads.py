"""Where the nodes of a launch run: processes of this machine (``local``), the tasks of a SLURM job,
or Ray tasks on a running Ray cluster. Placement is SLURM's or Ray's; each road only starts the
same ``rstar2 launch-node`` once a node, gives it the run's fresh secrets in its environment (never
on a command line, in the sbatch script or in a log), and ends them all when the head ends. An
engine node lost mid-run is said and the run goes on (the trainer takes its engines out of
rotation); any other node lost ends the launch."""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..auth import KEY_ENV
from ..sandbox.redis_queue import PASSWORD_ENV
from . import plan as P
from .node import spawn

TEMPLATE = Path(__file__).with_name("sbatch.sh.j2")


class LaunchError(RuntimeError):
    """The launch ended without the run finishing: which node, and why (its error line)."""


def run_secrets() -> dict[str, str]:
    """A fresh API key for every service and a fresh Redis password, for this launch only."""
    return {KEY_ENV: secrets.token_hex(24), PASSWORD_ENV: secrets.token_hex(24)}


def node_args(python: str, plan_file: str | None, rank: str, hosts: str, attempt: str) -> list[str]:
    args = ["launch-node", "--rank", rank, "--hosts", hosts, "--attempt", attempt]
    return [python, "-m", "rstar2", *args, *(["--plan", plan_file] if plan_file else [])]


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
    stop: Callable[[], None]  # asks it to stop
    join: Callable[[], None]  # waits until it has
    log: Path


def supervise(nodes: list[NodeHandle], say: Callable[[str], None]) -> int:
    """Until the head ends (its status): another trainer node that fails ends the launch; one that
    ends well (its share done) or an engine node lost (the others serve on) does not."""
    ended: set[int] = set()
    try:
        while True:
            for node in nodes:
                code = node.poll()
                if code is None or node.rank in ended:
                    continue
                if node.rank == 0:
                    if code:
                        raise LaunchError(f"node 0 (head) ended ({code}): {said_error(node.log)}")
                    return 0
                if code and node.kind != "engine":
                    raise LaunchError(
                        f"node {node.rank} ({node.kind}) ended ({code}): {said_error(node.log)}"
                    )
                ended.add(node.rank)
                if code:  # an engine node (0: it left as the run ended)
                    say(
                        f"[rstar2] node {node.rank} (engine) was lost ({code}): the run goes on on the other engines"
                    )
            time.sleep(0.5)
    finally:  # every node told at once, then waited for: each gives its roles grace_s
        for node in nodes:
            node.stop()
        for node in nodes:
            node.join()


# -- this machine ---------------------------------------------------------------------------------
def run_local(plan: P.Plan, attempt: int, say: Callable[[str], None]) -> int:
    """Every node a process of this machine on 127.0.0.1 (a workstation's GPUs shared out in order)."""
    cluster, logs = plan.cluster, log_of(plan, attempt, 0).parent
    plan_file = logs / "plan.json"  # written by the command (with the folder), for every road
    hosts = ",".join(["127.0.0.1"] * cluster.nodes)
    env = {**os.environ, **run_secrets(), P.RUN_ENV: plan.run_id}
    gpus = P.visible_gpus() if cluster.gpus_per_node else []
    nodes = []
    for rank in range(cluster.nodes):
        mine = gpus[rank * cluster.gpus_per_node : (rank + 1) * cluster.gpus_per_node]
        node_env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(mine)} if mine else env
        log = logs / f"node{rank}.log"
        args = node_args(plan.python, str(plan_file), str(rank), hosts, str(attempt))
        proc = spawn(args, log, node_env, plan.cwd)
        nodes.append(
            NodeHandle(rank, P.node_kind(cluster, rank), proc.poll, *stopper(proc, cluster.grace_s), log)
        )
    say(f"[rstar2] {cluster.nodes} nodes on this machine; logs in {logs}")
    return supervise(nodes, say)


def stopper(proc: subprocess.Popen, grace_s: float) -> tuple[Callable[[], None], Callable[[], None]]:
    def join() -> None:
        try:
            proc.wait(grace_s + 15)  # the node gives its roles grace_s, then kills them
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    return (lambda: proc.poll() is None and proc.terminate()), join


# -- SLURM ----------------------------------------------------------------------------------------
def sbatch_script(plan: P.Plan, attempt: int) -> str:
    """The job script: one task a node, each told its rank by ``SLURM_PROCID`` and the nodes'
    addresses by SLURM; the plan inside it (no file has to reach every node)."""
    import jinja2

    cluster = plan.cluster
    roles = []
    for r in range(cluster.nodes):
        kind = P.node_kind(cluster, r)
        ports = f", engines on ports {P.port(cluster, r, P.ENGINE)}+" if kind == "engine" else ""
        roles.append(f"node {r}: {kind}{ports}")
    shell = jinja2.Environment(keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    shell.filters["q"] = shlex.quote
    template = shell.from_string(TEMPLATE.read_text())
    return template.render(
        plan=plan,
        cluster=cluster,
        roles=roles,
        attempt=attempt,
        logs=f"{plan.run_dir}/launch",
        node=" ".join(node_args(shlex.quote(plan.python), None, "$RANK", '"$HOSTS"', '"$ATTEMPT"')),
        plan_env=P.PLAN_ENV,
        run_env=P.RUN_ENV,
    )


def run_slurm(plan: P.Plan, script: Path, attempt: int, say: Callable[[str], None]) -> int:
    """Submit with the cluster's own ``sbatch --wait``; the launcher's end (Ctrl-C, SIGTERM) cancels
    the job: SIGTERM to every task (each node gives its roles ``grace_s``, within SLURM's KillWait),
    then, after ``grace_s``, a plain ``scancel`` (a job still queued, or still running)."""
    env = {**os.environ, **run_secrets(), P.RUN_ENV: plan.run_id}  # sbatch exports them to the job
    proc = subprocess.Popen(
        ["sbatch", "--parsable", "--wait", str(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    job = ""
    try:
        job = (proc.stdout.readline() if proc.stdout else "").strip().split(";")[0]
        say(f"[rstar2] SLURM job {job}: {script}; logs in {log_of(plan, attempt, 0).parent}")
        code = proc.wait()
    except KeyboardInterrupt:
        if job:
            cancel(job, plan.cluster.grace_s, proc, env)
        if proc.poll() is None:
            proc.kill()  # sbatch --wait only waits
            proc.wait()
        raise
    if code:
        # this attempt's logs (a requeue's: later)
        logs = sorted(log_of(plan, attempt, 0).parent.glob("node*.log"))
        said = [
            f"{log.name}: {said_error(log)}" for log in logs if "error:" in log.read_text(errors="replace")
        ]
        raise LaunchError(f"SLURM job {job} ended ({code})" + (": " + "; ".join(said) if said else ""))
    return 0


def cancel(job: str, grace_s: float, waiting: subprocess.Popen, env: dict[str, str]) -> None:
    """A queued job removed; a running one's tasks sent SIGTERM (each node stops its roles, the
    trainer first with ``grace_s``, then the others, then Redis), then removed if still there."""
    state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True)
    if state.stdout.strip() not in ("PENDING", ""):
        subprocess.run(["scancel", "--signal=TERM", "--full", job], env=env, check=False)
        with contextlib.suppress(subprocess.TimeoutExpired):
            waiting.wait(3 * grace_s + 30)
            return
    subprocess.run(["scancel", job], env=env, check=False)
    with contextlib.suppress(subprocess.TimeoutExpired):
        waiting.wait(60)


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
        nodes = []
        for rank in range(cluster.nodes):
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)
            options = {"num_cpus": 1, "num_gpus": cluster.gpus_per_node, "scheduling_strategy": strategy}
            ref = node.options(**options).remote(plan.to_json(), rank, hosts, attempt, secrets_env)
            log = log_of(plan, attempt, rank)
            stop, join = ray_stoppers(ref, cluster.grace_s)
            nodes.append(NodeHandle(rank, P.node_kind(cluster, rank), ray_poll(ref, log), stop, join, log))
        say(
            f"[rstar2] {cluster.nodes} nodes placed by Ray at {address} ({hosts}); logs in {log_of(plan, attempt, 0).parent}"
        )
        return supervise(nodes, say)
    finally:
        remove_placement_group(group)
        ray.shutdown()


def log_of(plan: P.Plan, attempt: int, rank: int) -> Path:
    return Path(plan.run_dir) / "launch" / f"attempt-{attempt}" / f"node{rank}.log"


def ray_poll(ref, log: Path) -> Callable[[], int | None]:
    """The node task's exit status; where Ray says why it ended (a node lost, a task killed), that
    reason is written to the node's log as its error, as a node says its own."""
    import ray

    def poll() -> int | None:
        done, _ = ray.wait([ref], timeout=0)
        if not done:
            return None
        try:
            return int(ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - Ray's words kept: the node could not say them
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a") as out:
                out.write(
                    f"error: Ray: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}\n"
                )
            return -1

    return poll


def ray_stoppers(ref, grace_s: float) -> tuple[Callable[[], None], Callable[[], None]]:
    """Cancel the task (its node process is told SIGTERM and stops its roles), then wait; a task
    still there after ``grace_s`` is killed with its worker."""
    import ray

    def join() -> None:
        done, _ = ray.wait([ref], timeout=grace_s + 15)
        if not done:
            ray.cancel(ref, force=True)

    return (lambda: ray.cancel(ref)), join


def run_node_task(plan_json: str, rank: int, hosts: str, attempt: int, env: dict[str, str]) -> int:
    """A Ray task: this node's ``rstar2 launch-node``, its log in the run folder as it sees it."""
    plan = P.Plan.from_json(plan_json)
    log = log_of(plan, attempt, rank)
    log.parent.mkdir(parents=True, exist_ok=True)
    child_env = {**os.environ, **env, P.PLAN_ENV: plan_json}
    # this node's Python; its own session, out of the worker's process group (killed outright on a
    # force cancel): the worker's end is a SIGTERM, and the node stops its roles in order
    args = node_args(sys.executable, None, str(rank), hosts, str(attempt))
    proc = spawn(args, log, child_env, plan.cwd if Path(plan.cwd).is_dir() else None)
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait()

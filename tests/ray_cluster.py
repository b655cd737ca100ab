"""A real Ray cluster of several nodes on loopback, for tests (not a test module itself).

    with ray_cluster(tmp_path, [{"num_cpus": 2}, {"num_cpus": 2, "num_gpus": 1}]) as cluster:
        ray.init(address=cluster.address)
        ...
        cluster.kill_node(1)  # SIGKILL node 1's processes: losing a node mid-run

Each node is its own `ray start --block` process in its own session (the head first, then the
workers in parallel), so a node can be killed alone and teardown touches nothing but this cluster's
processes. GPUs are logical counts (`num_gpus`), so placement can be tested on a CPU machine; a
task holding a GPU sees CUDA_VISIBLE_DEVICES set to its ids by Ray.

Ray 2.60 on Linux rewrites a loopback address (127.0.0.1, localhost) into the machine's own address,
everywhere: `ray start --node-ip-address 127.0.0.1`, `ray start --address 127.0.0.1:P` and
`ray.init(address="127.0.0.1:P")` all end up at e.g. 192.0.2.2, where nothing listens, and hang.
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` keeps loopback as it is (it is read once, when `ray` is
first imported) but also makes `ray start --address` refuse to start a worker node ("Multi-node Ray
clusters are not supported on Windows and OSX"). So every node here runs the `ray` CLI through a
small bootstrap that lifts that one refusal for its own process, with the variable set to 0;
this module sets it in os.environ when imported, so a driver in this process (imported after it)
connects to 127.0.0.1 too. Ray's client server (port 10001 by default, whenever grpcio is
installed) is not started, the dashboard is off, usage stats are off, and every other port is
chosen by the system at bind time, so clusters of parallel test sessions cannot collide.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Read by ray._private.ray_constants when `ray` is first imported, in this process and every
# process started from it.
LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}
os.environ.update(LOOPBACK_ENV)

HOST = "127.0.0.1"
START_DEADLINE_S = 90.0
STOP_DEADLINE_S = 30.0
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # Ray's minimum is 75 MiB; its default is 30% of RAM per node
NODE_KEYS = {"num_cpus", "num_gpus", "resources", "object_store_memory", "memory", "labels"}
# AF_UNIX socket paths are limited to 107 bytes; Ray puts its sockets at
# <temp-dir>/session_<date>_<time>_<micros>_<pid>/sockets/plasma_store (about 65 bytes more).
MAX_TEMP_ROOT = 36

# The `ray` CLI, with its refusal to start a worker node while RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
# lifted (the CLI alone reads its copy of the flag; address resolution still sees 0 and keeps
# 127.0.0.1), and without the Ray client server, which would take port 10001 on every head.
_BOOT = """
import sys
import ray._private.ray_constants as constants
import ray.scripts.scripts as cli

class _Constants:
    ENABLE_RAY_CLUSTER = True
    def __getattr__(self, name):
        return getattr(constants, name)

assert not constants.ENABLE_RAY_CLUSTER, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was not seen"
assert hasattr(cli, "ray_constants") and hasattr(cli, "get_ray_client_dependency_error")
cli.ray_constants = _Constants()
cli.get_ray_client_dependency_error = lambda: ImportError("no Ray client server in tests")
sys.argv = ["ray", *sys.argv[1:]]
sys.exit(cli.main())
"""

# A driver that waits for the cluster's nodes and prints them as JSON (one line, last).
_WAIT = """
import json, sys, time
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
want, deadline = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while True:
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) >= want or time.monotonic() > deadline:
        break
    time.sleep(0.2)
print(json.dumps([{"node_id": n["NodeID"], "ip": n["NodeManagerAddress"],
                   "raylet_socket": n["RayletSocketName"], "resources": n["Resources"]} for n in alive]))
"""


class RayClusterError(RuntimeError):
    """The cluster did not come up (or did not go away) in time; the message has the logs' tails."""


@dataclass
class RayNode:
    index: int
    spec: dict[str, Any]
    temp_dir: Path
    log: Path  # the `ray start` command's own output
    process: subprocess.Popen | None = None
    node_id: str | None = None  # Ray's hex node id, once the node is up
    killed: bool = False

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid  # also its session id and process group id

    def session_dirs(self) -> list[Path]:
        return sorted(p for p in self.temp_dir.glob("session_2*") if p.is_dir())


@dataclass
class RayCluster:
    workdir: Path
    root: Path  # the nodes' temp dirs: <root>/n<i> (short, for Ray's socket paths)
    nodes: list[RayNode]
    address: str = ""  # "127.0.0.1:PORT", the head's GCS, for ray.init(address=...)
    env: dict[str, str] = field(default_factory=dict)  # the environment a driver process needs

    @property
    def node_ids(self) -> list[str]:
        return [n.node_id or "" for n in self.nodes]

    def node_index(self, node_id: str) -> int:
        return self.node_ids.index(node_id)

    def kill_node(self, i: int) -> None:
        """SIGKILL node i's whole process tree (raylet, agents, workers, their children); returns when
        none of it is left. Ray notices on its own: tasks there fail at once with NodeDiedError (when
        their max_retries is 0), and the node is marked dead about 12 s later."""
        node = self.nodes[i]
        node.killed = True
        _kill_tree(node, deadline=time.monotonic() + STOP_DEADLINE_S)

    def pids(self, i: int) -> list[int]:
        """The live processes of node i (its session, its descendants)."""
        return _node_pids(self.nodes[i])

    def logs(self, i: int, lines: int = 30) -> str:
        return _node_logs(self.nodes[i], lines)

    def init(self, **kwargs: Any) -> Any:
        """ray.init(address=self.address, **kwargs) in this process, checking first that `ray` keeps
        127.0.0.1 (it would otherwise connect to the machine's own address, and hang there)."""
        import ray
        from ray._private import ray_constants

        if ray_constants.ENABLE_RAY_CLUSTER:
            raise RayClusterError(
                "`ray` was imported before tests.ray_cluster (or with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER "
                "unset): ray.init would turn 127.0.0.1 into this machine's own address and hang there; "
                "set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before the first `import ray`"
            )
        return ray.init(address=self.address, **kwargs)


def _node_args(node: RayNode, head_address: str | None) -> list[str]:
    spec = node.spec
    unknown = set(spec) - NODE_KEYS
    if unknown:
        raise ValueError(f"node {node.index}: unknown keys {sorted(unknown)} (known: {sorted(NODE_KEYS)})")
    args = [
        "start",
        "--block",
        "--node-ip-address",
        HOST,
        "--temp-dir",
        str(node.temp_dir),
        "--num-cpus",
        str(int(spec.get("num_cpus", 1))),
        "--num-gpus",
        str(int(spec.get("num_gpus", 0))),
        "--object-store-memory",
        str(int(spec.get("object_store_memory", OBJECT_STORE_BYTES))),
        "--min-worker-port",
        "0",
        "--max-worker-port",
        "0",
        "--dashboard-agent-listen-port",
        "0",
        "--disable-usage-stats",
        "--log-style",
        "record",
        "--log-color",
        "false",
    ]
    if spec.get("resources"):
        args += ["--resources", json.dumps(spec["resources"])]
    if spec.get("memory") is not None:
        args += ["--memory", str(int(spec["memory"]))]
    if spec.get("labels"):
        args += ["--labels", ",".join(f"{k}={v}" for k, v in spec["labels"].items())]
    if head_address is None:
        args += ["--head", "--port", "0", "--include-dashboard", "false"]
    else:
        args += ["--address", head_address]
    return args


def _start(node: RayNode, head_address: str | None, env: dict[str, str]) -> None:
    node.temp_dir.mkdir(parents=True, exist_ok=True)
    with open(node.log, "ab") as out:
        node.process = subprocess.Popen(
            [sys.executable, "-c", _BOOT, *_node_args(node, head_address)],
            cwd=node.temp_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session: every process of the node but escapees shares it
        )


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, session id) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[3])


def _node_pids(node: RayNode) -> list[int]:
    """Live (non-zombie) processes in the node's session, and every descendant of those (a worker's
    child that called setsid is still a descendant while its parent lives)."""
    if node.process is None:
        return []
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _proc_stat(int(entry))) is not None and st[0] not in "ZX":
            table[int(entry)] = st
    found = {pid for pid, (_, _, sid) in table.items() if sid == node.pid}
    grew = True
    while grew:
        more = {pid for pid, (_, ppid, _) in table.items() if ppid in found} - found
        grew = bool(more)
        found |= more
    found.discard(os.getpid())
    return sorted(found)


def _kill_tree(node: RayNode, deadline: float) -> None:
    while True:
        pids = _node_pids(node)
        if node.process is not None and node.process.poll() is None:
            pids.append(node.process.pid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if node.process is not None:
            try:
                node.process.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        if time.monotonic() > deadline:
            raise RayClusterError(
                f"node {node.index}: processes {pids} survived SIGKILL for {STOP_DEADLINE_S} s"
            )
        time.sleep(0.05)


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"({e})"
    return "\n".join(text[-lines:])


def _node_logs(node: RayNode, lines: int = 30) -> str:
    parts = [f"--- node {node.index} ({node.spec}) `ray start`: {node.log}", _tail(node.log, lines)]
    for session in node.session_dirs()[-1:]:
        for name in ("gcs_server.err", "raylet.err", "raylet.out", "ray_process_exit.log"):
            path = session / "logs" / name
            if path.exists() and path.stat().st_size:
                parts += [f"--- {path}", _tail(path, lines)]
    return "\n".join(parts)


def _fail(cluster: RayCluster, why: str) -> RayClusterError:
    """The error, with the log tails of every node: those whose `ray start` exited first."""
    nodes = sorted(cluster.nodes, key=lambda n: n.process is None or n.process.poll() is None)
    return RayClusterError(why + "\n" + "\n".join(_node_logs(n, 20) for n in nodes))


def _wait_head(cluster: RayCluster, deadline: float) -> str:
    head = cluster.nodes[0]
    address_file = head.temp_dir / "ray_current_cluster"
    while time.monotonic() < deadline:
        if address_file.exists() and (address := address_file.read_text().strip()):
            if not address.startswith(HOST + ":"):
                raise _fail(cluster, f"the head took address {address!r}, not one on {HOST}")
            return address
        if head.process is not None and head.process.poll() is not None:
            raise _fail(cluster, f"the head's `ray start` exited with {head.process.returncode}")
        time.sleep(0.1)
    raise _fail(cluster, "the head did not write its address in time")


def _wait_nodes(cluster: RayCluster, deadline: float) -> None:
    """All nodes alive in ray.nodes(), seen from a driver process; fails at once if a node's `ray start`
    exits (a bad option, a port taken), with every node's log tails."""
    want = len(cluster.nodes)
    left = max(deadline - time.monotonic(), 1.0)
    waiter = subprocess.Popen(
        [sys.executable, "-c", _WAIT, cluster.address, str(want), str(left)],
        cwd=cluster.root,
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while waiter.poll() is None:
            dead = [n.index for n in cluster.nodes if n.process is not None and n.process.poll() is not None]
            if dead:
                raise _fail(cluster, f"`ray start` exited for node(s) {dead} before the cluster was up")
            if time.monotonic() > deadline + 15:
                raise _fail(cluster, f"a driver could not list the cluster's nodes in {left:.0f} s")
            time.sleep(0.1)
        out, err = waiter.communicate()
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
    if waiter.returncode != 0 or not out.strip():
        raise _fail(cluster, f"the node-listing driver failed ({waiter.returncode}):\n{err[-3000:]}")
    alive = json.loads(out.strip().splitlines()[-1])
    for node in cluster.nodes:
        node.node_id = next(
            (a["node_id"] for a in alive if a["raylet_socket"].startswith(str(node.temp_dir) + os.sep)), None
        )
    missing = [n.index for n in cluster.nodes if n.node_id is None]
    if missing or len(alive) != want:
        raise _fail(
            cluster, f"{len(alive)} of {want} nodes alive after {left:.0f} s; missing node(s) {missing}"
        )


@contextmanager
def ray_cluster(
    workdir: Path, nodes: list[dict[str, Any]], start_deadline_s: float = START_DEADLINE_S
) -> Iterator[RayCluster]:
    """Start a Ray cluster of len(nodes) nodes on 127.0.0.1 (nodes[0] is the head), yield it once every
    node is alive, and on exit SIGKILL every process of it and wait until none is left.

    A node is a dict of num_cpus (default 1), num_gpus (logical, default 0), resources (custom
    resources), object_store_memory (default 100 MiB), memory, labels. Logs: workdir/ray-n<i>.log for
    `ray start`, <cluster.root>/n<i>/session_*/logs for Ray's own (cluster.logs(i) gives tails)."""
    if not nodes:
        raise ValueError("a cluster needs at least one node")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    local = workdir / "ray"
    if len(str(local.resolve())) <= MAX_TEMP_ROOT:
        local.mkdir(exist_ok=True)
        root, made = local.resolve(), False
    else:
        root, made = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp")), True
        if not local.exists():
            local.symlink_to(root)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES")}
    env.update(LOOPBACK_ENV)
    env["AUTOSCALER_METRIC_PORT"] = "0"  # the head's autoscaler metrics: 44217 unless told otherwise
    cluster = RayCluster(
        workdir=workdir,
        root=root,
        env=env,
        nodes=[
            RayNode(i, dict(spec), root / f"n{i}", workdir / f"ray-n{i}.log") for i, spec in enumerate(nodes)
        ],
    )
    ok = False
    try:
        deadline = time.monotonic() + start_deadline_s
        _start(cluster.nodes[0], None, env)
        cluster.address = _wait_head(cluster, deadline)
        for node in cluster.nodes[1:]:
            _start(node, cluster.address, env)
        _wait_nodes(cluster, deadline)
        yield cluster
        ok = True
    finally:
        stop_deadline = time.monotonic() + STOP_DEADLINE_S
        errors = []
        for node in reversed(cluster.nodes):
            if node.killed:  # kill_node already saw every process of it gone
                continue
            try:
                _kill_tree(node, stop_deadline)
            except RayClusterError as e:
                errors.append(str(e))
        if made and ok and not errors:
            shutil.rmtree(root, ignore_errors=True)
            local.unlink(missing_ok=True)
        if errors and ok:
            raise RayClusterError("; ".join(errors))

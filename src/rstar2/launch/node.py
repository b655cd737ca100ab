"""One node of a launch (``rstar2 launch-node``): the same program on every node and every road,
told only its rank and the nodes' addresses. It starts what its kind runs (the head: Redis with a
password, the sandbox service, the trainer's weight service; every node: a sandbox worker; engine
nodes: an engine a GPU; trainer nodes: the trainer), checks each piece with a deadline and a named
error, and watches them: a dead role ends the node (an engine is started again, and the trainer
brings it back on the current weights), and the head's end ends every node.

The nodes meet in the head's Redis: each says it joined; the head waits for all, checks every
service from the trainer's side (healthy, the key accepted, strangers refused), then says go; when
the trainer ends it says done with its exit status. Logs: ``RUN/launch/attempt-N/node{R}-{role}.log``.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..auth import KEY_ENV, client_headers
from ..sandbox.redis_queue import PASSWORD_ENV
from . import plan as P

POLL_S = 0.5


class NodeError(RuntimeError):
    """A launch failed on this node: which check, which role, where its log is."""


def set_death_signal(sig: int = signal.SIGTERM) -> None:
    """This process gets ``sig`` when its parent dies (Linux), so nothing outlives a killed launcher."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def deadline(what: str, seconds: float, check: Callable[[], Any], why: Callable[[], str] = lambda: "") -> Any:
    """``check()``'s first truthy answer, polled; a ``NodeError`` naming ``what`` after ``seconds``."""
    end = time.monotonic() + seconds
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > end:
            raise NodeError(f"{what} within {seconds:.0f} s{why()}")
        time.sleep(POLL_S)


class Role:
    """One process of this node, in its own process group, its output in its log."""

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.args, self.log, self.env = name, args, log, env
        self.restarts = 0
        self.proc = self.start()

    def start(self) -> subprocess.Popen:
        with open(self.log, "ab") as out:
            return subprocess.Popen(
                self.args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
                preexec_fn=set_death_signal,
            )

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def tail(self, lines: int = 12) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n    " + "\n    ".join(text) if text else ""


class Node:
    def __init__(self, plan: P.Plan, rank: int, hosts: list[str], attempt: int) -> None:
        if len(hosts) != plan.cluster.nodes:
            raise NodeError(f"{len(hosts)} node addresses for a cluster of {plan.cluster.nodes} nodes")
        self.plan, self.cluster, self.rank, self.hosts = plan, plan.cluster, rank, hosts
        self.kind = P.node_kind(self.cluster, rank)
        self.run = Path(plan.run_dir)
        self.logs = self.run / "launch" / f"attempt-{attempt}"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.prefix = f"rstar2:launch:{plan.run_id}:{attempt}:"
        self.roles: list[Role] = []
        self.redis: Any = None

    # -- roles ------------------------------------------------------------------------------------
    def where(self, role: str = "") -> str:
        log = self.logs / f"node{self.rank}-{role}.log" if role else self.logs / f"node{self.rank}.log"
        return f"node {self.rank} ({self.kind}, {self.hosts[self.rank]}){f', {role}' if role else ''} (its log: {log})"

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, P.RUN_ENV: self.plan.run_id, **extra}

    def start(self, name: str, args: list[str], **env: str) -> Role:
        role = Role(name, args, self.logs / f"node{self.rank}-{name}.log", self.env(**env))
        self.roles.append(role)
        return role

    def rstar2(self, *args: str) -> list[str]:
        return [self.plan.python, "-m", "rstar2", *args]

    def port(self, offset: int) -> int:
        return P.port(self.cluster, self.rank, offset)

    def wait(
        self, what: str, seconds: float, check: Callable[[], Any], why: Callable[[], str] = lambda: ""
    ) -> Any:
        """``deadline``, but a role of this node that exits meanwhile is said at once."""

        def checked() -> Any:
            for role in self.roles:
                if role.proc.poll() is not None and role.name != "trainer":
                    raise NodeError(f"{self.where(role.name)}: exited ({role.proc.returncode}){role.tail()}")
            return check()

        return deadline(what, seconds, checked, why)

    def check_ports(self) -> None:
        """The ports this node's roles will bind are free (a fixed band, never probed and released)."""
        wanted = (
            {P.ENGINE + g: f"engine-{g}" for g in range(P.engines_on(self.cluster))}
            if self.kind == "engine"
            else {}
        )
        if self.kind == "head":
            wanted = {
                P.REDIS: "redis",
                P.SANDBOX: "sandbox",
                P.WEIGHTS: "weights",
                P.RENDEZVOUS: "rendezvous",
            }
        host = self.hosts[self.rank]
        for offset, role in wanted.items():
            with socket.socket() as s:
                s.setsockopt(
                    socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
                )  # as servers bind: TIME_WAIT is no owner
                try:
                    s.bind((host, self.port(offset)))
                    s.listen()
                except OSError as exc:
                    raise NodeError(
                        f"{self.where()}: port {self.port(offset)} for its {role} is taken ({exc.strerror}): "
                        f"stop what holds it, or move the band (cluster.port_base)"
                    ) from None

    # -- the head's services ----------------------------------------------------------------------
    def start_redis(self) -> None:
        conf_dir = Path(tempfile.mkdtemp(prefix="rstar2-redis-"))
        conf = conf_dir / "redis.conf"  # the password in a file only this user reads, not on a command line
        conf.touch(mode=0o600)
        conf.write_text(
            f"bind {self.hosts[0]}\nport {self.port(P.REDIS)}\nrequirepass {os.environ[PASSWORD_ENV]}\n"
            f'save ""\nappendonly no\ndir {conf_dir}\n'
        )
        self.start("redis", ["redis-server", str(conf)])

    def connect_redis(self) -> None:
        """The head's Redis, reached with the password, and refusing a client without it."""
        import redis

        host, port = self.hosts[0], P.port(self.cluster, 0, P.REDIS)

        def answered(password: str | None) -> Any:
            client = redis.Redis(host, port, password=password, socket_timeout=5)
            try:
                client.ping()
                return client
            except redis.AuthenticationError as exc:
                return exc
            except redis.ResponseError as exc:
                return exc if "NOAUTH" in str(exc) or "AUTH" in str(exc) else None
            except redis.ConnectionError:
                return None

        what = f"{self.where()}: the head's Redis at {host}:{port} did not answer"
        found = deadline(what, self.cluster.start_timeout_s, lambda: answered(os.environ[PASSWORD_ENV]))
        if isinstance(found, Exception):
            raise NodeError(f"{self.where()}: the head's Redis refused the launch's password: {found}")
        if not isinstance(answered(None), Exception):
            raise NodeError(f"{self.where()}: the head's Redis at {host}:{port} answers without a password")
        self.redis = found

    def key(self, what: str) -> str:
        return self.prefix + what

    def start_head(self) -> None:
        if self.cluster.shared_fs:
            canary = secrets_hex()
            (self.run / "launch").mkdir(parents=True, exist_ok=True)
            (self.run / "launch" / "canary").write_text(canary)
        self.start_redis()
        self.connect_redis()
        if self.cluster.shared_fs:
            self.redis.set(self.key("canary"), canary)
        redis_url = P.redis_url(self.cluster, self.hosts)
        host = self.hosts[0]
        sandbox = [
            "sandbox",
            "serve",
            "--host",
            host,
            "--port",
            str(self.port(P.SANDBOX)),
            "--redis",
            redis_url,
        ]
        self.start("sandbox", self.rstar2(*sandbox))
        if self.over_http:  # the run folder and the starting model, read-only, to the engine nodes
            serve = ["-m", "rstar2.weight_transfer", "--host", host, "--port", str(self.port(P.WEIGHTS))]
            roots = ["--root", str(self.run), "--root", self.starting_model]
            self.start("weights", [self.plan.python, *serve, *roots])

    @property
    def over_http(self) -> bool:
        """Weights travel over HTTP: engines that do not share the run folder."""
        return not self.cluster.shared_fs and self.cluster.engine_nodes > 0

    def check_canary(self) -> None:
        """The run folder the head writes is the one this node reads (a shared filesystem)."""
        canary = self.run / "launch" / "canary"

        def seen() -> bool:
            try:
                return canary.read_text() == (self.redis.get(self.key("canary")) or b"").decode()
            except OSError:
                return False

        self.wait(
            f"{self.where()}: the run folder is not shared with the head: {canary} does not hold the head's "
            "canary (cluster.shared_fs: true); share it, or set cluster.shared_fs: false (weights over HTTP)",
            self.cluster.start_timeout_s,
            seen,
        )

    # -- every node -------------------------------------------------------------------------------
    def start_worker(self) -> None:
        url = P.redis_url(self.cluster, self.hosts)
        workers = str(self.cluster.sandbox_workers_per_node)
        self.start(
            "worker",
            self.rstar2(
                "sandbox", "worker", "--redis", url, "--workers", workers, "--name", f"node{self.rank}"
            ),
        )

    def model(self) -> str:
        """The starting model the engines serve (the head prepares a recipe's and names it)."""
        found = self.wait(
            f"{self.where()}: the head did not name the starting model",
            self.cluster.start_timeout_s,
            lambda: self.redis.get(self.key("model")),
        )
        return found.decode()

    def start_engines(self) -> None:
        model, host = self.model(), self.hosts[self.rank]
        if self.over_http and not Path(model, "config.json").exists():  # the starting model, fetched first
            self.fetch(model)
        devices = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        rank = P.lora_rank(self.plan) if self.cluster.engine == "vllm" else None
        for g in range(P.engines_on(self.cluster)):
            args = [
                self.cluster.engine,
                "--model",
                model,
                "--host",
                host,
                "--port",
                str(self.port(P.ENGINE + g)),
            ]
            args += ["--weights-from", str(self.run), "--weights-from", model]
            if self.cluster.engine == "serve":
                args += ["--device", "cuda" if self.cluster.gpus_per_node else "cpu"]
            args += ["--lora-rank", str(rank)] if rank else []
            gpu = (
                {"CUDA_VISIBLE_DEVICES": devices[g]}
                if self.cluster.gpus_per_node and g < len(devices)
                else {}
            )
            self.start(f"engine-{g}", self.rstar2(*args, *self.cluster.engine_args), **gpu)
        for g, role in enumerate(r for r in self.roles if r.name.startswith("engine-")):
            url = f"http://{host}:{self.port(P.ENGINE + g)}"
            self.wait_healthy(url, role)

    def fetch(self, folder: str) -> None:
        import asyncio

        from ..weight_transfer import mirror

        source = P.service_url(self.cluster, self.hosts, P.WEIGHTS)
        try:
            asyncio.run(mirror(source, folder, [Path(folder).resolve()], os.environ[KEY_ENV]))
        except Exception as exc:  # noqa: BLE001 - said with where it happened
            raise NodeError(
                f"{self.where()}: could not fetch the starting model {folder} from {source}: {exc}"
            ) from None

    def wait_healthy(self, url: str, role: Role) -> None:
        import httpx

        def up() -> bool:
            if role.proc.poll() is not None:
                raise NodeError(
                    f"{self.where(role.name)}: exited ({role.proc.returncode}) while starting{role.tail()}"
                )
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        self.wait(
            f"{self.where(role.name)}: {url} did not answer /health",
            self.cluster.start_timeout_s,
            up,
            role.tail,
        )

    def join(self) -> None:
        roles = [r.name for r in self.roles]
        self.redis.hset(
            self.key("joined"), str(self.rank), json.dumps({"host": self.hosts[self.rank], "roles": roles})
        )

    # -- the head's checks, from the trainer's side -------------------------------------------------
    def wait_joined(self) -> None:
        def missing() -> list[int]:
            joined = {int(k) for k in self.redis.hkeys(self.key("joined"))}
            return [r for r in range(self.cluster.nodes) if r not in joined]

        def why() -> str:
            late = missing()
            logs = ", ".join(str(self.logs / f"node{r}.log") for r in late)
            return f": node{'s' if len(late) > 1 else ''} {', '.join(map(str, late))} missing (logs: {logs})"

        self.wait("not every node joined", self.cluster.start_timeout_s, lambda: not missing(), why)

    def check_services(self) -> None:
        """Every engine and the sandbox service answer from here, take the key and refuse a stranger;
        the sandbox runs a call through the Redis workers."""
        import httpx

        def check(url: str, what: str, probe: Callable[[dict[str, str]], httpx.Response]) -> None:
            try:
                stranger, keyed = probe({}), probe(client_headers(os.environ[KEY_ENV]))
            except httpx.HTTPError as exc:
                raise NodeError(
                    f"{self.where()}: {what} at {url} cannot be reached from the head: {exc}"
                ) from None
            if stranger.status_code != 401:
                raise NodeError(
                    f"{self.where()}: {what} at {url} answers a caller without the key ({stranger.status_code})"
                )
            if keyed.status_code != 200:
                raise NodeError(
                    f"{self.where()}: {what} at {url} refused the launch's key ({keyed.status_code}: {keyed.text[:200]})"
                )

        if self.over_http:
            weights = P.service_url(self.cluster, self.hosts, P.WEIGHTS)
            self.wait_healthy(weights, next(r for r in self.roles if r.name == "weights"))
            listed = {"folder": str(self.run)}
            check(
                weights,
                "the weight service",
                lambda h: httpx.get(f"{weights}/weights/manifest", params=listed, headers=h, timeout=30),
            )
        for url in P.engine_urls(self.cluster, self.hosts):
            check(url, "engine", lambda h, u=url: httpx.get(u + "/v1/models", headers=h, timeout=30))
        sandbox = P.service_url(self.cluster, self.hosts, P.SANDBOX)
        self.wait_healthy(sandbox, next(r for r in self.roles if r.name == "sandbox"))
        call = {"code": "print(6 * 7)"}
        check(
            sandbox,
            "the sandbox service",
            lambda h: httpx.post(sandbox + "/run", json=call, headers=h, timeout=60),
        )

    def write_run(self) -> Path:
        """The run's config (or recipe) with the cluster's addresses, in this node's run folder."""
        import yaml

        path = self.run / "launch" / ("recipe.yaml" if self.plan.kind == "recipe" else "config.yaml")
        tmp = path.with_suffix(f".{self.rank}.tmp")
        tmp.write_text(yaml.safe_dump(P.run_tree(self.plan, self.hosts), sort_keys=False))
        tmp.replace(path)
        return path

    def start_trainer(self) -> Role:
        run = str(self.write_run())
        if self.plan.kind == "recipe":
            return self.start(
                "trainer",
                self.rstar2(
                    "train", "--recipe", run, "--out", self.plan.run_dir, "--resume", "--no-progress"
                ),
            )
        per_node = max(1, self.cluster.gpus_per_node)
        torchrun = [
            self.plan.python,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(self.cluster.trainer_nodes),
        ]
        torchrun += ["--nproc-per-node", str(per_node), "--node-rank", str(self.rank)]
        torchrun += [
            "--master-addr",
            self.hosts[0],
            "--master-port",
            str(P.port(self.cluster, 0, P.RENDEZVOUS)),
        ]
        return self.start("trainer", [*torchrun, "-m", "rstar2", "train", run, "--resume", "--no-progress"])

    # -- the whole node ---------------------------------------------------------------------------
    def up(self) -> Role | None:
        """Start and check this node's roles; the trainer's role where this node trains."""
        self.check_ports()
        if self.kind == "head":
            self.start_head()
        else:
            self.connect_redis()
            if self.cluster.shared_fs:  # else weights travel over HTTP (or no engine reads the folder)
                self.check_canary()
        self.start_worker()
        if self.kind == "head":
            self.redis.set(self.key("model"), self.starting_model)
        if self.kind == "engine":
            self.start_engines()
        self.join()
        if self.kind == "head":
            self.wait_joined()
            self.check_services()
            self.redis.set(self.key("go"), "1")
        elif self.kind == "trainer":
            self.wait(
                f"{self.where()}: the head did not finish its checks",
                2 * self.cluster.start_timeout_s,
                lambda: self.redis.get(self.key("go")),
            )
        return self.start_trainer() if self.kind != "engine" else None

    @functools.cached_property
    def starting_model(self) -> str:
        if self.plan.kind == "recipe":
            from ..recipe.run import prepare_model
            from ..recipe.spec import parse_recipe

            return str(prepare_model(parse_recipe(self.plan.tree, check_paths=False), self.run).resolve())
        run = self.plan.tree["run"]
        return str(Path(run.get("init_from") or self.plan.tree["model"]["path"]).resolve())

    def watch(self, trainer: Role | None) -> int:
        """Until the trainer ends (the head: its status, told to every node), the head says done,
        or a role dies for good."""
        lost_head = None
        while True:
            for role in self.roles:
                code = role.proc.poll()
                if code is None:
                    continue
                if role is trainer:
                    if self.kind == "head":
                        self.done(code)
                    return code
                if role.name.startswith("engine-") and role.restarts < self.cluster.engine_restarts:
                    role.restarts += 1
                    print(
                        f"[rstar2] {self.where(role.name)} exited ({code}): started again ({role.restarts}/{self.cluster.engine_restarts})",
                        flush=True,
                    )
                    role.proc = role.start()
                    continue
                raise NodeError(f"{self.where(role.name)}: exited ({code}){role.tail()}")
            if self.kind != "head":
                try:
                    if self.redis.get(self.key("done")) is not None:
                        self.redis.hdel(self.key("joined"), str(self.rank))
                        return 0
                    lost_head = None
                except Exception:  # noqa: BLE001 - an unreachable head: waited out, then said
                    lost_head = lost_head or time.monotonic()
                    if time.monotonic() - lost_head > self.cluster.start_timeout_s:
                        raise NodeError(
                            f"{self.where()}: lost the head node (its Redis stopped answering)"
                        ) from None
            time.sleep(POLL_S)

    def done(self, code: int) -> None:
        """The trainer's status to every node; Redis kept until they have left (``grace_s`` at most)."""
        self.redis.set(self.key("done"), str(code))
        end = time.monotonic() + self.cluster.grace_s
        while self.redis.hlen(self.key("joined")) > 1 and time.monotonic() < end:
            time.sleep(POLL_S)

    def stop(self) -> None:
        """The trainer first (nothing waits on dead services), Redis last; SIGTERM, ``grace_s``, SIGKILL."""
        order = sorted(self.roles, key=lambda r: (r.name != "trainer", r.name == "redis"))
        for role in order:
            role.signal(signal.SIGTERM)
            end = time.monotonic() + self.cluster.grace_s
            while role.proc.poll() is None and time.monotonic() < end:
                time.sleep(0.1)
            role.signal(signal.SIGKILL)
            role.proc.wait()


class Stopped(NodeError):
    """SIGTERM or SIGINT: the node stops its roles, a checkpoint in flight given ``grace_s``."""


def secrets_hex() -> str:
    import secrets

    return secrets.token_hex(16)


def run_node(plan: P.Plan, rank: int, hosts: list[str], attempt: int) -> int:
    """This node's part of the launch, start to end; the exit status (a NodeError said on stderr)."""
    import sys

    set_death_signal()
    node = Node(plan, rank, hosts, attempt)

    def stop(signum: int, frame: Any) -> None:
        raise Stopped(f"{node.where()}: stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        return node.watch(node.up())
    except Stopped:
        return 143
    except NodeError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        node.stop()

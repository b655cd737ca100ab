"""One node of a launch (``rstar2 launch-node``): the same program on every node and every road,
told only its rank and the nodes' addresses. It starts what its kind runs (the head: Redis with a
password, the sandbox service, the weight service; every node: a sandbox worker; engine nodes: an
engine a GPU; trainer nodes: the trainer), checks each piece (``checks.py``), and watches them: a
dead role ends the node (an engine is started again, and the trainer brings it back on the current
weights), and the head's end ends every node.

The nodes meet in the head's Redis: each says it joined; the head waits for all, checks every
service from the trainer's side, then says go; when the trainer ends it says done. Logs:
``RUN/launch/attempt-N/node{R}.log`` (the node's own words) and ``node{R}-{role}.log``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..auth import KEY_ENV, loopback
from ..local_service import healthy
from ..sandbox import linux
from ..sandbox.redis_queue import PASSWORD_ENV
from . import checks as C
from . import plan as P
from .checks import NodeError

DONE_WAIT_S = 10.0


def set_death_signal() -> None:
    """This process gets SIGTERM when its parent dies (Linux), so nothing outlives a killed launcher."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(args: list[str], log: Path, env: dict[str, str], cwd: str | None = None) -> subprocess.Popen:
    """A process of the launch: its output appended to ``log``, in a session of its own (so it and
    its children are stopped as one), and told SIGTERM when its parent dies (nothing outlives it)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=set_death_signal,
        )


class Role:
    """One process of this node (``spawn``), started again where it is an engine that died."""

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.args, self.log, self.env = name, args, log, env
        self.restarts = 0
        self.proc = self.start()

    def start(self) -> subprocess.Popen:
        return spawn(self.args, self.log, self.env)

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

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
        self.prefix = f"rstar2:launch:{plan.run_id}:{attempt}:"  # this attempt's keys in the head's Redis
        self.roles: list[Role] = []
        self.redis: Any = None

    def where(self, role: str = "") -> str:
        log = self.logs / (f"node{self.rank}-{role}.log" if role else f"node{self.rank}.log")
        return f"node {self.rank} ({self.kind}, {self.hosts[self.rank]}){f', {role}' if role else ''} (its log: {log})"

    def key(self, what: str) -> str:
        return self.prefix + what

    def port(self, offset: int, rank: int | None = None) -> int:
        return P.port(self.cluster, self.rank if rank is None else rank, offset)

    def url(self, offset: int) -> str:
        return P.service_url(self.cluster, self.hosts, offset)

    def start(self, name: str, args: list[str], **env: str) -> Role:
        role = Role(name, args, self.logs / f"node{self.rank}-{name}.log", {**os.environ, **env})
        self.roles.append(role)
        return role

    def rstar2(self, *args: str) -> list[str]:
        return [self.plan.python, "-m", "rstar2", *args]

    def wait(
        self, what: str, check: Callable[[], Any], why: Callable[[], str] = lambda: "", factor: int = 1
    ) -> Any:
        """``checks.deadline`` at ``start_timeout_s``; a role of this node that exits meanwhile is said at once."""

        def checked() -> Any:
            for role in self.roles:
                if role.proc.poll() is not None and role.name != "trainer":
                    raise NodeError(f"{self.where(role.name)}: exited ({role.proc.returncode}){role.tail()}")
            return check()

        return C.deadline(what, factor * self.cluster.start_timeout_s, checked, why)

    def wait_healthy(self, url: str, role: Role) -> None:
        self.wait(f"{self.where(role.name)}: {url} did not answer /health", lambda: healthy(url), role.tail)

    @property
    def bind(self) -> str:
        """The address this node's services bind: its own on loopback (the tests, one machine); every
        interface on a cluster, where a node's name may resolve to 127.0.1.1 on the node itself (each
        service asks for the key, Redis for its password)."""
        return self.hosts[self.rank] if loopback(self.hosts[self.rank]) else "0.0.0.0"

    @property
    def over_http(self) -> bool:
        """Weights travel over HTTP: engine nodes that do not share the run folder."""
        return not self.cluster.shared_fs and self.cluster.engine_nodes > 0

    # -- the roles ----------------------------------------------------------------------------------
    def start_head(self) -> None:
        """Redis (the password in a file only this user reads), the sandbox service over it, the
        weight service where engines fetch the weights, the canary where they read the folder."""
        host = self.bind
        conf_dir = Path(tempfile.mkdtemp(prefix="rstar2-redis-"))
        conf = conf_dir / "redis.conf"
        conf.touch(mode=0o600)
        conf.write_text(
            f"bind {host}\nport {self.port(P.REDIS)}\nrequirepass {os.environ[PASSWORD_ENV]}\n"
            f'save ""\nappendonly no\ndir {conf_dir}\n'
        )
        self.start("redis", ["redis-server", str(conf)])
        self.connect()
        shutil.rmtree(conf_dir)  # read at its start: the password lives on in no file
        if self.cluster.shared_fs:
            canary = secrets.token_hex(16)
            (self.run / "launch" / "canary").write_text(canary)
            self.redis.set(self.key("canary"), canary)
        sandbox = ["--host", host, "--port", str(self.port(P.SANDBOX))]
        sandbox += ["--redis", P.redis_url(self.cluster, self.hosts)]
        self.start("sandbox", self.rstar2("sandbox", "serve", *sandbox))
        if self.over_http:  # the run folder and the starting model, read-only
            serve = ["-m", "rstar2.weight_transfer", "--host", host, "--port", str(self.port(P.WEIGHTS))]
            serve += ["--root", str(self.run), "--root", self.starting_model]
            self.start("weights", [self.plan.python, *serve])

    def connect(self) -> None:
        where, port = self.where(), self.port(P.REDIS, rank=0)
        self.redis = C.redis_client(
            self.hosts[0], port, os.environ[PASSWORD_ENV], self.cluster.start_timeout_s, where
        )

    def check_canary(self) -> None:
        """The run folder the head writes is the one this node reads."""
        canary = self.run / "launch" / "canary"

        def seen() -> bool:
            try:
                return canary.read_text() == (self.redis.get(self.key("canary")) or b"").decode()
            except OSError:
                return False

        self.wait(
            f"{self.where()}: the run folder is not shared with the head: {canary} does not hold the head's "
            "canary (cluster.shared_fs: true); share it, or set cluster.shared_fs: false (weights over HTTP)",
            seen,
        )

    def start_worker(self) -> None:
        url, workers = P.redis_url(self.cluster, self.hosts), str(self.cluster.sandbox_workers_per_node)
        args = ["--redis", url, "--workers", workers, "--name", f"node{self.rank}"]
        self.start("worker", self.rstar2("sandbox", "worker", *args))

    def start_engines(self) -> None:
        """An engine a GPU (one on a CPU), on the starting model the head names (fetched first when
        the run folder is not shared and it is not here)."""
        model = self.wait(
            f"{self.where()}: the head did not name the starting model",
            lambda: self.redis.get(self.key("model")),
        ).decode()
        if self.over_http and not Path(model, "config.json").exists():
            self.fetch(model)
        host, devices = self.bind, P.visible_gpus() if self.cluster.gpus_per_node else []
        adapters = P.lora_rank(self.plan) if self.cluster.engine == "vllm" else None
        engines = []
        for g in range(P.engines_on(self.cluster)):
            args = ["--model", model, "--host", host, "--port", str(self.port(P.ENGINE + g))]
            args += ["--weights-from", str(self.run), "--weights-from", model]
            args += ["--fetch-from", self.url(P.WEIGHTS)] if self.over_http else []
            if self.cluster.engine == "serve":
                args += ["--device", "cuda" if self.cluster.gpus_per_node else "cpu"]
            args += ["--lora-rank", str(adapters)] if adapters else []
            args += self.cluster.engine_args
            gpu = {"CUDA_VISIBLE_DEVICES": devices[g]} if g < len(devices) else {}
            engines.append(self.start(f"engine-{g}", self.rstar2(self.cluster.engine, *args), **gpu))
        for g, role in enumerate(engines):
            self.wait_healthy(f"http://{self.hosts[self.rank]}:{self.port(P.ENGINE + g)}", role)

    def fetch(self, folder: str) -> None:
        import asyncio

        from ..weight_transfer import mirror

        source = self.url(P.WEIGHTS)
        try:
            asyncio.run(mirror(source, folder, [Path(folder).resolve().parent], pinned=source))
        except Exception as exc:  # noqa: BLE001 - said with where it happened
            raise NodeError(
                f"{self.where()}: could not fetch the starting model {folder} from {source}: {exc}"
            ) from None

    @functools.cached_property
    def starting_model(self) -> str:
        """The model the engines start on: a recipe's (prepared here, in the run folder), or the config's."""
        if self.plan.kind == "recipe":
            from ..recipe.run import prepare_model
            from ..recipe.spec import parse_recipe

            return str(prepare_model(parse_recipe(self.plan.tree, check_paths=False), self.run).resolve())
        return str(Path(self.plan.tree["run"].get("init_from") or self.plan.tree["model"]["path"]).resolve())

    def check_services(self) -> None:
        """From the head (the trainer's side): every service answers, takes the key and refuses a
        stranger; the sandbox runs a call through the Redis workers."""
        import httpx

        def get(url: str, **options: Any) -> Callable[[dict[str, str]], Any]:
            return lambda headers: httpx.get(url, headers=headers, timeout=30, **options)

        for name, offset in (("weights", P.WEIGHTS), ("sandbox", P.SANDBOX)):
            role = next((r for r in self.roles if r.name == name), None)
            if role is not None:
                self.wait_healthy(self.url(offset), role)
        asked = []
        if self.over_http:
            weights = self.url(P.WEIGHTS) + "/weights/manifest"
            asked.append(("the weight service", weights, get(weights, params={"folder": str(self.run)})))
        asked += [("engine", url, get(url + "/v1/models")) for url in P.engine_urls(self.cluster, self.hosts)]
        sandbox, call = self.url(P.SANDBOX) + "/run", {"code": "print(6 * 7)"}
        asked.append(
            ("the sandbox service", sandbox, lambda h: httpx.post(sandbox, json=call, headers=h, timeout=60))
        )
        C.services_answer(asked, self.where())

    def start_trainer(self) -> Role:
        """The run's config (or recipe) wired to the cluster, written here; the trainer on it."""
        import yaml

        path = self.run / "launch" / ("recipe.yaml" if self.plan.kind == "recipe" else "config.yaml")
        tmp = path.with_suffix(f".{self.rank}.tmp")
        tmp.write_text(yaml.safe_dump(P.run_tree(self.plan, self.hosts), sort_keys=False))
        tmp.replace(path)
        if self.plan.kind == "recipe":
            train = ["train", "--recipe", str(path), "--out", str(self.run), "--resume", "--no-progress"]
            return self.start("trainer", self.rstar2(*train))
        torchrun = ["--nnodes", str(self.cluster.trainer_nodes)]
        torchrun += ["--nproc-per-node", str(max(1, self.cluster.gpus_per_node))]
        torchrun += ["--node-rank", str(self.rank), "--master-addr", self.hosts[0]]
        torchrun += ["--master-port", str(self.port(P.RENDEZVOUS, rank=0))]
        train = ["-m", "rstar2", "train", str(path), "--resume", "--no-progress"]
        # nodes on this machine: the collectives on loopback too (else they take the hostname's address)
        lo = (
            {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"} if all(map(loopback, self.hosts)) else {}
        )
        return self.start(
            "trainer", [self.plan.python, "-m", "torch.distributed.run", *torchrun, *train], **lo
        )

    # -- the whole node -------------------------------------------------------------------------------
    def up(self) -> Role | None:
        """Start and check this node's roles; the trainer's role where this node trains."""
        ports: dict[int, str] = {}
        if self.kind == "head":
            ports = {P.REDIS: "redis", P.SANDBOX: "sandbox", P.WEIGHTS: "weights", P.RENDEZVOUS: "rendezvous"}
        elif self.kind == "engine":
            ports = {P.ENGINE + g: f"engine-{g}" for g in range(P.engines_on(self.cluster))}
        C.ports_free(self.bind, {self.port(o): role for o, role in ports.items()}, self.where())
        if self.kind == "head":
            self.start_head()
        else:
            self.connect()
            if self.cluster.shared_fs:  # else weights travel over HTTP (or no engine reads the folder)
                self.check_canary()
        self.start_worker()
        if self.kind == "head":
            if self.over_http:  # engine nodes fetch the model as soon as it is named: serve it first
                self.wait_healthy(self.url(P.WEIGHTS), next(r for r in self.roles if r.name == "weights"))
            self.redis.set(self.key("model"), self.starting_model)
        if self.kind == "engine":
            self.start_engines()
        self.redis.hset(self.key("joined"), str(self.rank), json.dumps([r.name for r in self.roles]))
        if self.kind == "head":

            def missing() -> list[int]:
                joined = {int(k) for k in self.redis.hkeys(self.key("joined"))}
                return [r for r in range(self.cluster.nodes) if r not in joined]

            def why() -> str:
                late = missing()
                return f": node {', '.join(map(str, late))} missing (logs: {', '.join(str(self.logs / f'node{r}.log') for r in late)})"

            self.wait("not every node joined", lambda: not missing(), why)
            self.check_services()
            self.redis.set(self.key("go"), "1")
        elif self.kind == "trainer":
            self.wait(
                f"{self.where()}: the head did not finish its checks",
                lambda: self.redis.get(self.key("go")),
                factor=2,
            )
        return self.start_trainer() if self.kind != "engine" else None

    def watch(self, trainer: Role | None) -> int:
        """Until the trainer ends (the head: its status, told to every node), the head says done,
        or a role dies for good."""
        lost_head = None
        while True:
            for role in self.roles:
                if (code := role.proc.poll()) is None:
                    continue
                if role is trainer:
                    if self.kind == "head":
                        self.done(code)
                    else:
                        self.redis.hdel(self.key("joined"), str(self.rank))
                    return code
                if role.name.startswith("engine-") and role.restarts < self.cluster.engine_restarts:
                    role.restarts += 1
                    said = f"started again ({role.restarts}/{self.cluster.engine_restarts})"
                    print(f"[rstar2] {self.where(role.name)} exited ({code}): {said}", flush=True)
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
            time.sleep(C.POLL_S)

    def done(self, code: int) -> None:
        """The trainer's status to every node; Redis kept until the others have seen it (they look
        twice a second; a node lost or already gone is not waited for past ``DONE_WAIT_S``)."""
        self.redis.set(self.key("done"), str(code))
        end = time.monotonic() + DONE_WAIT_S
        while self.redis.hlen(self.key("joined")) > 1 and time.monotonic() < end:
            time.sleep(C.POLL_S)

    def stop(self) -> None:
        """The trainer first (a checkpoint in flight finishes), then every other role, Redis last;
        each SIGTERM, then ``grace_s``, then SIGKILL."""
        trainer = [r for r in self.roles if r.name == "trainer"]
        others = [r for r in self.roles if r.name not in ("trainer", "redis")]
        for group in (trainer, others, [r for r in self.roles if r.name == "redis"]):
            for role in group:
                role.signal(signal.SIGTERM)
            end = time.monotonic() + self.cluster.grace_s
            while any(r.proc.poll() is None for r in group) and time.monotonic() < end:
                time.sleep(0.1)
            for role in group:
                role.signal(signal.SIGKILL)
                role.proc.wait()


class Stopped(NodeError):
    """SIGTERM or SIGINT: the node stops its roles, a checkpoint in flight given ``grace_s``."""


def run_node(plan: P.Plan, rank: int, hosts: list[str], attempt: int) -> int:
    """This node's part of the launch, start to end; the exit status (an error said on stderr)."""
    set_death_signal()
    os.environ[P.RUN_ENV] = plan.run_id  # every process of the launch carries it
    node: Node | None = None

    def stop(signum: int, frame: Any) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal does not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        missing = [name for name in (KEY_ENV, PASSWORD_ENV) if not os.environ.get(name)]
        if missing:
            raise NodeError(
                f"node {rank}: ${' and $'.join(missing)} not set: the launch gives them (sbatch exports them)"
            )
        node = Node(plan, rank, hosts, attempt)
        return node.watch(node.up())
    except Stopped:
        return 143
    except Exception as exc:  # noqa: BLE001 - a node's failure is one line, its cause named
        said = str(exc) if isinstance(exc, NodeError) else f"node {rank}: {type(exc).__name__}: {exc}"
        print(f"error: {said}", file=sys.stderr, flush=True)
        return 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        if node is not None:
            node.stop()

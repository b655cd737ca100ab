"""A private single-host SLURM cluster for tests (Debian's slurm-wlm 22.05, scripts/setup-slurm.sh).

``slurm_cluster(workdir, nodes=1, cpus=4)`` starts munged (its own key and socket), slurmctld and
one slurmd per node, all as root, all on 127.0.0.1, everything (config, state, spool, logs, pid
files) under ``workdir``; it yields a ``SlurmCluster`` whose ``env`` makes sbatch, srun, squeue,
scancel, sinfo and sacct talk to this cluster only (``SLURM_CONF``; the munge socket is named in
slurm.conf's ``AuthInfo``). On exit it cancels what is still queued or running, kills job-step
processes left over, stops the daemons by PID and waits for them; the files stay for diagnosis.

Several nodes on one host: every slurmd runs with ``-N nodeK``, its own port, spool folder, pid
and log file; the nodes share the host's hostname and 127.0.0.1, so jobs see node names n1..nK
(``SLURM_JOB_NODELIST``) but one hostname.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as e:
        return f"(no {path.name}: {e.strerror})"
    return "\n".join(text)


@dataclass
class SlurmCluster:
    workdir: Path
    conf: Path
    nodes: list[str]
    partition: str
    env: dict[str, str]
    logs: list[Path] = field(default_factory=list)
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    def run(self, *args: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run a SLURM client command (``sinfo``, ``squeue``, ...) against this cluster."""
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def diagnostics(self) -> str:
        return "".join(f"\n--- {p} (tail) ---\n{_tail(p)}" for p in self.logs)

    def processes(self) -> list[int]:
        """PIDs of this cluster's job-step processes still alive: slurmstepd and everything a job
        started (recognised by SLURM_CONF=this cluster's slurm.conf plus SLURM_JOB_ID in their
        environment; slurmstepd inherits slurmd's environment, which names this slurm.conf)."""
        mine, daemons = f"SLURM_CONF={self.conf}".encode(), {p.pid for p in self.daemons.values()}
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in daemons:
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                comm = (entry / "comm").read_text().strip()
                state = next(x for x in (entry / "stat").read_text().rsplit(")", 1)[1].split() if x)
            except (OSError, StopIteration):
                continue
            if state == "Z" or mine not in environ:
                continue
            if comm == "slurmstepd" or any(v.startswith(b"SLURM_JOB_ID=") for v in environ):
                pids.append(int(entry.name))
        return sorted(pids)

    def wait_idle(self, timeout: float = START_TIMEOUT_S) -> None:
        """Return once every node is idle; raise with the daemons' log tails after ``timeout``."""
        deadline, last = time.monotonic() + timeout, ""
        while True:
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode} during start-up{self.diagnostics()}")
            r = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=15)
            last = (r.stdout + r.stderr).strip()
            states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
            if r.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"SLURM nodes {self.nodes} not idle within {timeout:.0f} s; sinfo: {last!r}{self.diagnostics()}"
                )
            time.sleep(0.2)

    def _cancel_all(self, grace_s: float = 15.0) -> None:
        self.run("scancel", "--partition", self.partition, check=False, timeout=15)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (self.run("squeue", "-h", check=False).stdout.strip() or self.processes()):
            time.sleep(0.2)
        for pid in self.processes():  # what SIGTERM, KillWait and SIGKILL through slurmstepd missed
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def need_slurm() -> None:
    """Raise FileNotFoundError naming what is missing (scripts/setup-slurm.sh installs it)."""
    missing = [b for b in ("sbatch", "srun", "sinfo", "slurmctld", "slurmd", "munged") if shutil.which(b) is None]
    if missing:
        raise FileNotFoundError(f"SLURM is not installed ({', '.join(missing)} missing); run scripts/setup-slurm.sh")


def _which(name: str) -> str:  # the daemons live in /usr/sbin, not always on a test runner's PATH
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin") or name


@contextmanager
def slurm_cluster(workdir: Path, nodes: int = 1, cpus: int = 4) -> Iterator[SlurmCluster]:
    if nodes < 1:
        raise ValueError("nodes must be at least 1")
    need_slurm()
    workdir = Path(workdir).resolve()
    munge, state, log = workdir / "munge", workdir / "state", workdir / "log"
    for d in (munge, state, log):
        d.mkdir(parents=True, exist_ok=True)
    # munged insists on an owner-only key in a folder that others cannot write; its socket folder
    # must be searchable by all (it warns otherwise).
    munge.chmod(0o755)
    key = munge / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = munge / "munge.socket"

    host = socket.gethostname().split(".")[0]
    names = [f"n{i + 1}" for i in range(nodes)]
    ports = {n: _free_port() for n in names}
    ctld_port, partition = _free_port(), "debug"
    conf = workdir / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=rstar2test",
                f"SlurmctldHost={host}(127.0.0.1)",
                f"SlurmctldPort={ctld_port}",
                f"SlurmdPort={ports[names[0]]}",
                # bind the node's and the controller's addresses (127.0.0.1), never 0.0.0.0
                "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={sock}",
                f"StateSaveLocation={state}",
                f"SlurmdSpoolDir={workdir}/spool/%n",
                f"SlurmctldPidFile={workdir}/slurmctld.pid",
                f"SlurmdPidFile={workdir}/slurmd-%n.pid",
                f"SlurmctldLogFile={log}/slurmctld.log",
                f"SlurmdLogFile={log}/slurmd-%n.log",
                "SlurmctldDebug=info",
                "SlurmdDebug=info",
                "MailProg=/bin/true",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "JobCompType=jobcomp/none",
                "MpiDefault=none",
                "ReturnToService=2",
                # CPUs= is what the node offers even where the machine has fewer cores
                "SlurmdParameters=config_overrides",
                "KillWait=5",
                # `sbatch --wait` polls after 2 s, then every 8 s and 32 s unless 2 s >= MinJobAge/2:
                # 4 keeps it polling every 2 s (finished jobs then leave squeue within about a minute)
                "MinJobAge=4",
                "InactiveLimit=0",
                "SlurmdTimeout=60",
                "SchedulerType=sched/backfill",
                "SchedulerParameters=batch_sched_delay=0",  # batch jobs start at once, not 2-3 s later
                *(
                    f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[n]} CPUs={cpus} State=UNKNOWN"
                    for n in names
                ),
                f"PartitionName={partition} Nodes={','.join(names)} Default=YES MaxTime=INFINITE "
                "OverSubscribe=FORCE:16 State=UP",
                "",
            ]
        )
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for var in [v for v in env if v.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_")) and v != "SLURM_CONF"]:
        del env[var]  # a test run inside a SLURM job must not point these tools at that job

    cluster = SlurmCluster(workdir, conf, names, partition, env)
    cluster.logs = [log / "slurmctld.log", *(log / f"slurmd-{n}.log" for n in names)]
    with ExitStack() as stack:

        def start(name: str, argv: list[str]) -> None:
            out = (log / f"{name}.out").open("ab")
            stack.callback(out.close)
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            cluster.daemons[name] = proc
            stack.callback(_stop, proc)  # LIFO: slurmds first, then slurmctld, then munged
            cluster.logs.append(log / f"{name}.out")

        start(
            "munged",
            [
                _which("munged"),
                "--foreground",
                "--force",
                f"--socket={sock}",
                f"--key-file={key}",
                f"--pid-file={munge}/munged.pid",
                f"--log-file={munge}/munged.log",
                f"--seed-file={munge}/munged.seed",
            ],
        )
        deadline = time.monotonic() + 15
        while not sock.exists():
            if cluster.daemons["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start{cluster.diagnostics()}")
            time.sleep(0.05)
        start("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(conf)])
        for n in names:
            (workdir / "spool" / n).mkdir(parents=True, exist_ok=True)
            start(f"slurmd-{n}", [_which("slurmd"), "-D", "-N", n, "-f", str(conf)])
        cluster.wait_idle()
        stack.callback(cluster._cancel_all)  # runs before the daemons stop
        yield cluster

"""A private single-host SLURM cluster for tests (Debian's slurm-wlm 22.05; scripts/setup-slurm.sh).

``slurm_cluster(workdir, nodes=1, cpus=4)`` starts munged (its own key and socket), slurmctld and one
slurmd per node, all as root, all on 127.0.0.1, with everything (slurm.conf, state, spool folders,
logs, pid files) under ``workdir``, and yields a ``SlurmCluster``:

- ``env``: os.environ plus ``SLURM_CONF=<workdir>/slurm.conf`` (other SLURM_*/SBATCH_*/SRUN_* variables
  removed); sbatch, srun, squeue, scancel, sinfo, scontrol run under it talk to this cluster only. The
  munge socket reaches them through slurm.conf's ``AuthInfo=socket=...``. Jobs inherit it (sbatch
  exports the environment), so ``srun`` inside a batch script works. There is no accounting
  (``sacct`` answers "Slurm accounting storage is disabled"); ``sbatch --wait`` gives exit codes.
- ``nodes`` (["n1", ...]), ``partition`` ("debug"), ``conf``, ``workdir``, ``logs``;
- ``run(*argv)``: a client command under ``env``; ``processes()``: PIDs of job-step processes still
  alive; ``diagnostics()``: the daemons' log tails.

Several nodes on one host work (Debian builds SLURM with --enable-multiple-slurmd: ``scontrol show
config`` says ``MULTIPLE_SLURMD = Yes``): each slurmd runs ``-N nK`` with its own port, spool folder,
pid and log file. The nodes share the hostname and 127.0.0.1, so a job sees distinct node names
(``SLURM_JOB_NODELIST``, ``SLURMD_NODENAME``, ``SLURM_NODEID``) but one ``hostname``.

On exit it cancels whatever is queued or running, SIGKILLs job processes that outlive that, stops the
slurmds, slurmctld and munged by PID and waits for them; the files stay for diagnosis.
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
BINARIES = ("sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol", "slurmctld", "slurmd", "munged")


def _which(name: str) -> str | None:  # the daemons live in /usr/sbin, not always on PATH
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def need_slurm() -> None:
    """Raise FileNotFoundError naming what is missing (scripts/setup-slurm.sh installs it)."""
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        raise FileNotFoundError(
            f"SLURM is not installed ({', '.join(missing)} missing); run scripts/setup-slurm.sh"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"({e.strerror})"


def _stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class SlurmCluster:
    workdir: Path
    conf: Path
    nodes: list[str]
    partition: str
    env: dict[str, str]
    logs: list[Path] = field(default_factory=list)
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    def run(self, *argv: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """A SLURM client command (``sinfo``, ``squeue``, ``srun`` ...) against this cluster."""
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, check=check, timeout=timeout
        )

    def diagnostics(self) -> str:
        return "".join(f"\n--- {p} (tail) ---\n{_tail(p)}" for p in self.logs)

    def processes(self) -> list[int]:
        """PIDs of this cluster's live job-step processes: slurmstepd and whatever jobs started, known
        by ``SLURM_CONF=<this slurm.conf>`` in their environment (slurmstepd inherits slurmd's) plus
        ``SLURM_JOB_ID`` (which client commands such as a test's own ``sbatch --wait`` lack)."""
        mine, daemons = f"SLURM_CONF={self.conf}".encode(), {p.pid for p in self.daemons.values()}
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in daemons:
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                comm = (entry / "comm").read_text().strip()
                zombie = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            except (OSError, IndexError):
                continue
            if zombie or mine not in environ:
                continue
            if comm == "slurmstepd" or any(v.startswith(b"SLURM_JOB_ID=") for v in environ):
                pids.append(int(entry.name))
        return sorted(pids)

    def wait_idle(self, timeout: float = START_TIMEOUT_S) -> None:
        """Return once ``sinfo`` shows every node idle; raise with the daemons' log tails otherwise."""
        deadline, last = time.monotonic() + timeout, ""
        while True:
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode} during start-up{self.diagnostics()}"
                    )
            r = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=30)
            last = (r.stdout + r.stderr).strip()
            states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
            if r.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes):
                return
            bad = {n: s for n, s in states.items() if s.startswith(("inval", "drain", "down"))}
            if bad or time.monotonic() > deadline:
                why = f"nodes {bad}" if bad else f"SLURM nodes {self.nodes} not idle within {timeout:.0f} s"
                raise RuntimeError(f"{why}; sinfo: {last!r}{self.diagnostics()}")
            time.sleep(0.1)

    def _cancel_all(self, grace_s: float = 15.0) -> None:
        """Cancel every job (SIGTERM, SIGKILL after KillWait), wait for the queue to empty, then
        SIGKILL what is left: processes that left their step's process tree (a daemonized child,
        reparented to init) escape proctrack/linuxproc and outlive their job."""
        ctld = self.daemons.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            self.run("scancel", "--partition", self.partition, check=False, timeout=30)
            deadline, empty_since = time.monotonic() + grace_s, None
            while time.monotonic() < deadline and self.processes():
                queued = self.run("squeue", "-h", "-t", "PD,R,CG,S", check=False, timeout=30)
                if queued.returncode != 0:
                    break
                if not queued.stdout.strip():  # no job left: a moment for slurmstepd to exit
                    empty_since = empty_since or time.monotonic()
                    if time.monotonic() - empty_since > 1.0:
                        break
                time.sleep(0.1)
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _slurm_conf(workdir: Path, sock: Path, host: str, nodes: list[str], cpus: int, partition: str) -> str:
    ports = {n: _free_port() for n in nodes}
    lines = [
        "ClusterName=rstar2test",
        f"SlurmctldHost={host}(127.0.0.1)",  # the name must be this host's, or slurmctld refuses to start
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={ports[nodes[0]]}",
        # every daemon and srun binds its own address (127.0.0.1 here), never 0.0.0.0
        "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={sock}",
        f"StateSaveLocation={workdir}/state",
        f"SlurmdSpoolDir={workdir}/spool/%n",
        f"SlurmctldPidFile={workdir}/slurmctld.pid",
        f"SlurmdPidFile={workdir}/slurmd-%n.pid",
        f"SlurmctldLogFile={workdir}/log/slurmctld.log",
        f"SlurmdLogFile={workdir}/log/slurmd-%n.log",
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
        # CPUs= below is what a node offers even where the machine has fewer cores (else: INVAL,
        # "Low socket*core*thread count, Low CPUs")
        "SlurmdParameters=config_overrides",
        "KillWait=5",
        # `sbatch --wait` polls after 2 s, then sleeps 8 s and 32 s unless 2 s >= MinJobAge/2: 4 keeps
        # it polling every 2 s (finished jobs then leave squeue within about a minute)
        "MinJobAge=4",
        "InactiveLimit=0",
        "SlurmdTimeout=60",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0",  # batch jobs start within ~1 s, not 3
        *(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[n]} CPUs={cpus}" for n in nodes),
        f"PartitionName={partition} Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE "
        "OverSubscribe=FORCE:16 State=UP",  # jobs share CPUs (up to 16 per CPU)
    ]
    return "\n".join(lines) + "\n"


@contextmanager
def slurm_cluster(workdir: Path, nodes: int = 1, cpus: int = 4) -> Iterator[SlurmCluster]:
    if nodes < 1 or cpus < 1:
        raise ValueError("nodes and cpus must be at least 1")
    need_slurm()
    workdir = Path(workdir).resolve()
    munge, log = workdir / "munge", workdir / "log"
    names, partition = [f"n{i + 1}" for i in range(nodes)], "debug"
    for d in (munge, log, workdir / "state", *(workdir / "spool" / n for n in names)):
        d.mkdir(parents=True, exist_ok=True)
    # munged wants an owner-only key in a folder others cannot write, and warns unless everyone may
    # search the socket's folder.
    munge.chmod(0o755)
    key, sock = munge / "munge.key", munge / "munge.socket"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname().split(".")[0]
    conf = workdir / "slurm.conf"
    conf.write_text(_slurm_conf(workdir, sock, host, names, cpus, partition))

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_"))
    }
    env["SLURM_CONF"] = str(conf)  # a test run inside a SLURM job must not reach that job's cluster
    cluster = SlurmCluster(workdir, conf, names, partition, env)
    cluster.logs = [log / "slurmctld.log", *(log / f"slurmd-{n}.log" for n in names)]

    with ExitStack() as stack:

        def start(name: str, argv: list[str]) -> subprocess.Popen:
            out = (log / f"{name}.out").open("ab")  # stderr: start-up errors before the log file opens
            stack.callback(out.close)
            proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
            stack.callback(_stop, proc)  # in reverse: the slurmds, then slurmctld, then munged
            cluster.daemons[name] = proc
            cluster.logs.append(log / f"{name}.out")
            return proc

        munged = start(
            "munged",
            [
                _which("munged") or "munged",
                "--foreground",  # logs to stderr (munged.out), not --log-file
                "--force",  # a stale socket left by a killed run
                f"--socket={sock}",
                f"--key-file={key}",
                f"--pid-file={munge}/munged.pid",
                f"--log-file={munge}/munged.log",
                f"--seed-file={munge}/munged.seed",
            ],
        )
        deadline = time.monotonic() + 15
        while not sock.exists():
            if munged.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start{cluster.diagnostics()}")
            time.sleep(0.02)
        # -c: no jobs or node states recovered from an earlier run in this workdir
        start("slurmctld", [_which("slurmctld") or "slurmctld", "-D", "-c", "-f", str(conf)])
        for n in names:
            start(f"slurmd-{n}", [_which("slurmd") or "slurmd", "-D", "-N", n, "-f", str(conf)])
        cluster.wait_idle()
        stack.callback(cluster._cancel_all)  # first on exit, while the daemons still run
        yield cluster

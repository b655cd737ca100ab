#!/usr/bin/env python3
"""Sandbox benchmark: throughput, latency and server CPU per call of the local pool, the HTTP service
and Redis mode, against a fresh `python3 -c` per call measured in the same run (ratios: shared
machines are noisy). A user measures their own machine with it.

    python benchmarks/sandbox.py                   # the full table (1, 8, 64, 256 in flight)
    python benchmarks/sandbox.py --quick           # a short run (a minute or two)
    python benchmarks/sandbox.py --stress 45000    # also: 45,000 trivial calls at 4,096 in flight
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rstar2.local_service import free_port, wait_healthy
from rstar2.sandbox.client import Client
from rstar2.sandbox.local_pool import LocalPool
from rstar2.sandbox.request import ExecRequest
from rstar2.sandbox.result import ExecResult

WORKLOADS = {
    "trivial": ("print(1+1)", "2\n"),
    "sympy": ("import sympy as sp\nx = sp.Symbol('x')\nprint(sp.solve(x**2 - 5*x + 6, x))", "[2, 3]\n"),
    "loop": (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0:\n    pass\nprint('done')",
        "done\n",
    ),
}
CLK = os.sysconf("SC_CLK_TCK")
console = Console(stderr=True)


@dataclass
class Cell:
    mode: str
    workload: str
    in_flight: int
    calls: int
    wall_s: float
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    server_cpu_ms: float
    correct: int
    statuses: dict = field(default_factory=dict)
    ratio: float | None = None


# ----------------------------------------------------------------------------- CPU accounting
def tree_cpu_s(root: int) -> float:
    """CPU seconds of a process and all its descendants, including children they already reaped."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                text = fh.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        ppid = int(fields[1])
        cpu = sum(int(x) for x in fields[11:15]) / CLK  # utime stime cutime cstime
        stats[int(entry)] = (ppid, cpu)
    total, stack = 0.0, [root]
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    while stack:
        pid = stack.pop()
        if pid in stats:
            total += stats[pid][1]
        stack.extend(children.get(pid, []))
    return total


# ----------------------------------------------------------------------------- modes
class Baseline:
    """The released executor's approach: one fresh `python3 -c` subprocess per call."""

    name = "baseline"

    async def start(self):
        return self

    async def close(self):
        pass

    def cpu_s(self) -> float:
        t = os.times()
        return t.children_user + t.children_system

    async def run(self, req: ExecRequest) -> ExecResult:
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            req.code,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), req.timeout_s or 10)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            return ExecResult("timeout", duration_s=time.monotonic() - t0)
        status = "ok" if proc.returncode == 0 else "error"
        return ExecResult(status, out.decode(), err.decode(), duration_s=time.monotonic() - t0)


class Pool:
    name = "pool"

    def __init__(self, workers: int) -> None:
        self.pool = LocalPool(workers=workers)

    async def start(self):
        await self.pool.start()
        return self

    async def close(self):
        await self.pool.close()

    def cpu_s(self) -> float:
        t = os.times()
        return t.user + t.system + sum(tree_cpu_s(h.proc.pid) for h in self.pool.handles if h.proc)

    async def run(self, req):
        return await self.pool.run(req)


class Http:
    """`rstar2 sandbox serve` in its own process, called through the batching `Client`."""

    name = "http"

    def __init__(self, workers: int, redis_url: str | None = None) -> None:
        self.workers = workers
        self.redis_url = redis_url
        self.procs: list[subprocess.Popen] = []
        self.client = None

    def _spawn(self, args: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rstar2.cli", "sandbox", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs.append(proc)
        return proc

    async def start(self):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        if self.redis_url:
            serve = self._spawn(["serve", "--port", str(port), "--redis", self.redis_url])
            self._spawn(["worker", "--redis", self.redis_url, "--workers", str(self.workers)])
        else:
            serve = self._spawn(["serve", "--port", str(port), "--workers", str(self.workers)])
        await asyncio.to_thread(wait_healthy, url, serve, 180, "sandbox service")
        self.client = Client(url, batch_size=64, concurrency=16)
        await self.client.start()
        await asyncio.gather(*(self.client.run("1") for _ in range(self.workers * 4)))  # workers are up
        return self

    async def close(self):
        if self.client is not None:
            await self.client.close()
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()

    def cpu_s(self) -> float:
        return sum(tree_cpu_s(p.pid) for p in self.procs)

    async def run(self, req):
        return await self.client.run(req)


class RedisMode(Http):
    """As `Http`, over `serve --redis` and one worker node, with a throwaway redis-server."""

    name = "redis"

    def __init__(self, workers: int) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (scripts/setup.sh installs it)")
        self.dir = tempfile.mkdtemp(prefix="rstar2-bench-redis-")
        port = free_port()
        args = [*f"--port {port} --bind 127.0.0.1 --appendonly no".split(), "--save", "", "--dir", self.dir]
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.server = subprocess.Popen([binary, *args], **quiet)
        time.sleep(0.5)
        super().__init__(workers, f"redis://127.0.0.1:{port}/0")

    def cpu_s(self) -> float:
        return super().cpu_s() + tree_cpu_s(self.server.pid)

    async def close(self):
        await super().close()
        self.server.kill()
        self.server.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# ----------------------------------------------------------------------------- measuring
def calls_for(workload: str, in_flight: int, mode: str, quick: bool) -> int:
    if workload == "loop":
        return 8 if quick else 16
    if workload == "sympy" and mode == "baseline":
        return max(8, min(in_flight, 16 if quick else 32))  # a fresh interpreter importing sympy is slow
    base = 100 if quick else 1000 if workload == "trivial" else 300  # trivial cells last under 2 s
    return max(base, 2 * in_flight)


async def measure(runner, workload: str, in_flight: int, calls: list[tuple[ExecRequest, str]]) -> Cell:
    """Run `calls` (each a request and the stdout it must print), `in_flight` at a time."""
    sem = asyncio.Semaphore(in_flight)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    correct = 0

    async def one(req: ExecRequest, expected: str) -> None:
        nonlocal correct
        async with sem:
            t0 = time.perf_counter()
            r = await runner.run(req)
            latencies.append(time.perf_counter() - t0)
        statuses[r.status] = statuses.get(r.status, 0) + 1
        correct += r.stdout == expected

    cpu0 = runner.cpu_s()
    t0 = time.perf_counter()
    await asyncio.gather(*(one(req, expected) for req, expected in calls))
    wall = time.perf_counter() - t0
    n = len(calls)
    cpu = runner.cpu_s() - cpu0
    latencies.sort()
    pct = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000  # noqa: E731
    measured = (n, wall, n / wall, pct(0.5), pct(0.99), cpu / n * 1000)
    return Cell(runner.name, workload, in_flight, *measured, correct, statuses)


async def run_bench(
    quick: bool, modes: list[str], workloads: list[str], concurrency: list[int], workers: int
) -> list[Cell]:
    cells: list[Cell] = []
    factories = {
        "baseline": Baseline,
        "pool": lambda: Pool(workers),
        "http": lambda: Http(workers),
        "redis": lambda: RedisMode(workers),
    }
    total = len(modes) * len(workloads) * len(concurrency)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("sandbox benchmark", total=total)
        for mode in modes:
            try:
                runner = await factories[mode]().start()
            except Exception as exc:  # noqa: BLE001
                console.print(f"[yellow]skipping mode {mode}: {exc}[/yellow]")
                progress.advance(task, len(workloads) * len(concurrency))
                continue
            try:
                for workload in workloads:
                    for c in concurrency:
                        progress.update(task, description=f"{mode} / {workload} / {c} in flight")
                        n = calls_for(workload, c, mode, quick)
                        code, expected = WORKLOADS[workload]
                        calls = [(ExecRequest(code, timeout_s=30), expected)] * n
                        cells.append(await measure(runner, workload, min(c, n), calls))
                        cells[-1].in_flight = c
                        progress.advance(task)
            finally:
                await runner.close()
    base = {(c.workload, c.in_flight): c.calls_per_s for c in cells if c.mode == "baseline"}
    for c in cells:
        if (c.workload, c.in_flight) in base:
            c.ratio = c.calls_per_s / base[(c.workload, c.in_flight)]
    return cells


COLUMNS = {  # header: how a cell shows it
    "mode": lambda c: c.mode,
    "workload": lambda c: c.workload,
    "in flight": lambda c: str(c.in_flight),
    "calls": lambda c: str(c.calls),
    "calls/s": lambda c: f"{c.calls_per_s:.1f}",
    "× baseline": lambda c: "—" if c.ratio is None else f"{c.ratio:.1f}×",
    "p50 ms": lambda c: f"{c.p50_ms:.1f}",
    "p99 ms": lambda c: f"{c.p99_ms:.1f}",
    "server CPU ms/call": lambda c: f"{c.server_cpu_ms:.1f}",
    "correct": lambda c: f"{c.correct}/{c.calls}",
    "statuses": lambda c: " ".join(f"{k}:{v}" for k, v in sorted(c.statuses.items())),
}


def print_table(cells: list[Cell], workers: int) -> None:
    title = (
        f"rstar2 sandbox benchmark ({os.cpu_count()} cores, {workers} workers; ratio = calls/s vs baseline)"
    )
    table = Table(title=title)
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("mode", "workload", "statuses") else "right")
    for c in cells:
        table.add_row(*(show(c) for show in COLUMNS.values()))
    Console(width=200).print(table)


async def stress(n: int, in_flight: int, workers: int) -> dict:
    """Many trivial calls through the local pool, each with its own answer: correctness, statuses,
    wall time."""
    runner = await Pool(workers).start()
    try:
        calls = [(ExecRequest(f"print({i} + 1)"), f"{i + 1}\n") for i in range(n)]
        cell = await measure(runner, "stress", in_flight, calls)
    finally:
        await runner.close()
    return {
        "calls": n,
        "in_flight": in_flight,
        "wall_s": round(cell.wall_s, 1),
        "calls_per_s": round(cell.calls_per_s, 1),
        "correct": cell.correct,
        "statuses": cell.statuses,
    }


def main(
    quick: bool = False,
    modes: list[str] | None = None,
    workloads: list[str] | None = None,
    concurrency: list[int] | None = None,
    out: Path | None = None,
    workers: int | None = None,
    stress_calls: int = 0,
    stress_in_flight: int = 4096,
) -> list[Cell]:
    workers = workers or os.cpu_count() or 1
    modes = modes or ["baseline", "pool", "http", "redis"]
    workloads = workloads or list(WORKLOADS)
    concurrency = concurrency or [1, 8, 64, 256]
    cells = asyncio.run(run_bench(quick, modes, workloads, concurrency, workers))
    print_table(cells, workers)
    report: dict = {"cells": [asdict(c) for c in cells], "workers": workers, "cores": os.cpu_count()}
    if stress_calls:
        console.print(f"stress: {stress_calls} trivial calls, {stress_in_flight} in flight ...")
        report["stress"] = asyncio.run(stress(stress_calls, stress_in_flight, workers))
        Console(width=200).print(f"stress: {json.dumps(report['stress'])}")
    if out is not None:
        out.write_text(json.dumps(report, indent=2))
    return cells


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--modes", default="baseline,pool,http,redis")
    ap.add_argument("--workloads", default="trivial,sympy,loop")
    ap.add_argument("--concurrency", default="1,8,64,256")
    ap.add_argument("--workers", type=int, default=None, help="sandbox workers (default: CPU count)")
    ap.add_argument("--stress", type=int, default=0, help="also run this many trivial calls through the pool")
    ap.add_argument("--stress-in-flight", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    a = ap.parse_args()
    main(
        quick=a.quick,
        modes=a.modes.split(","),
        workloads=a.workloads.split(","),
        concurrency=[int(c) for c in a.concurrency.split(",")],
        out=a.out,
        workers=a.workers,
        stress_calls=a.stress,
        stress_in_flight=a.stress_in_flight,
    )

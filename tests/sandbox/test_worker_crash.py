"""A worker that dies mid-call: the call gets an `internal` result, nothing it started survives, and
the pool replaces the worker and keeps serving."""

from __future__ import annotations

import asyncio
import os
import signal

from rstar2.sandbox import ExecRequest, IsolationConfig, Limits, LocalPool

from ..conftest import sandbox_processes, wait_no_sandbox_processes_except


async def test_killed_worker_takes_its_call_with_it():
    before = set(sandbox_processes())
    async with LocalPool(workers=1, limits=Limits(timeout_s=30), isolation=IsolationConfig()) as pool:
        code = "import os, time\nfor _ in range(10):\n    if os.fork() == 0:\n        break\ntime.sleep(120)"
        call = asyncio.create_task(pool.run(ExecRequest(code)))
        for _ in range(200):  # wait until the call's processes exist
            await asyncio.sleep(0.05)
            if len(set(sandbox_processes()) - before) >= 5:
                break
        os.kill(pool.handles[0].proc.pid, signal.SIGKILL)  # the worker crashes
        result = await asyncio.wait_for(call, 60)
        assert result.status == "internal" and "replaced" in result.reason
        assert wait_no_sandbox_processes_except(before) == []
        assert (await pool.run("print('still serving')")).stdout == "still serving\n"


async def test_calls_are_routed_by_what_they_import(pool):
    light = await pool.run("import sys\nprint('sympy' in sys.modules)")
    full = await pool.run("import sys, sympy\nprint('sympy' in sys.modules)")
    assert (light.stdout, full.stdout) == ("False\n", "True\n")  # only the full zygote pre-imports sympy


async def test_a_killed_zygote_fails_its_call_and_is_restarted():
    before = set(sandbox_processes())
    async with LocalPool(workers=1, limits=Limits(timeout_s=30), isolation=IsolationConfig()) as pool:
        zygotes = {z["name"]: z["pid"] for z in pool.handles[0].hello["zygotes"]}
        assert set(zygotes) == {"light", "full"}
        call = asyncio.create_task(pool.run("import time\nprint('started', flush=True)\ntime.sleep(60)"))
        for _ in range(200):
            await asyncio.sleep(0.05)
            if len(set(sandbox_processes()) - before) >= 1:
                break
        os.kill(zygotes["light"], signal.SIGKILL)
        result = await asyncio.wait_for(call, 30)
        assert result.status == "internal" and "light zygote was lost" in result.reason
        assert result.stdout == "started\n"  # what it printed before is kept
        assert wait_no_sandbox_processes_except(before) == []
        assert (await pool.run("print('still serving')")).stdout == "still serving\n"
        assert pool.handles[0].restarts == 0  # the worker itself was not replaced


async def test_calls_queued_behind_a_crashed_worker_run_on_its_replacement():
    async with LocalPool(workers=1, limits=Limits(timeout_s=30), isolation=IsolationConfig()) as pool:
        assert pool.handles[0].depth == 2  # one call runs, the next waits in the worker's pipe
        running = asyncio.create_task(pool.run("import time\nprint('started', flush=True)\ntime.sleep(60)"))
        await asyncio.sleep(0.5)
        queued = asyncio.create_task(pool.run("print(6 * 7)"))
        await asyncio.sleep(0.5)
        assert not queued.done()
        os.kill(pool.handles[0].proc.pid, signal.SIGKILL)
        first, second = await asyncio.wait_for(asyncio.gather(running, queued), 60)
        assert first.status == "internal" and "replaced" in first.reason
        assert (second.status, second.stdout) == ("ok", "42\n")  # sent again, answered once
        assert pool.handles[0].restarts == 1


async def test_a_call_queued_behind_a_slow_one_is_handed_to_another_worker():
    async with LocalPool(workers=2, limits=Limits(timeout_s=30), isolation=IsolationConfig()) as pool:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        slow = asyncio.create_task(pool.run("import time\ntime.sleep(5)\nprint('slow')"))
        quick = [asyncio.create_task(pool.run(f"print({i})")) for i in range(12)]
        results = await asyncio.wait_for(asyncio.gather(*quick), 30)
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(12)]
        assert loop.time() - t0 < 4.0 and not slow.done()  # none waited for the slow call
        assert (await slow).stdout == "slow\n"

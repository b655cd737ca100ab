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
        os.kill(pool.executors[0].proc.pid, signal.SIGKILL)  # the worker crashes
        result = await asyncio.wait_for(call, 60)
        assert result.status == "internal" and "replaced" in result.reason
        assert wait_no_sandbox_processes_except(before) == []
        assert (await pool.run("print('still serving')")).stdout == "still serving\n"

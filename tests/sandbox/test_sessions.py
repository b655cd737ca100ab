"""Stateful sessions: state persists, a failed cell leaves the session as it was, idle expiry, LRU."""

from __future__ import annotations

import pytest
import pytest_asyncio

from rstar2.sandbox import ExecRequest, IsolationConfig, Limits, LocalPool

from ..conftest import descends_from, sandbox_processes, wait_no_sandbox_processes_except


@pytest_asyncio.fixture(scope="module")
async def pool():
    """A pool of its own: the shared one never holds sessions, so its leftover checks stay exact."""
    async with LocalPool(
        workers=2, limits=Limits(timeout_s=5.0), isolation=IsolationConfig(), max_sessions=8
    ) as p:
        yield p


async def cell(pool, sid: str, code: str, **kw):
    return await pool.run(ExecRequest(code, session_id=sid, **kw))


async def test_variables_persist_and_cells_do_not_replay(pool):
    assert (await cell(pool, "a", "x = 20\nprint('side effect')")).stdout == "side effect\n"
    r = await cell(pool, "a", "x += 1\nx * 2")
    assert (r.status, r.value, r.stdout) == ("ok", "42", "")  # the first cell's print is not re-run
    assert r.extra["cells"] == 2
    assert (await cell(pool, "b", "'x' in globals()")).value == "False"  # sessions are separate


async def test_crash_and_timeout_restore_the_previous_state(pool):
    await cell(pool, "c", "data = [1, 2, 3]")
    r = await cell(pool, "c", "data.append(4)\nimport ctypes\nctypes.string_at(0)")
    assert r.status == "error" and r.signal == "SIGSEGV" and "restored" in r.reason
    assert (await cell(pool, "c", "data")).value == "[1, 2, 3]"
    r = await cell(pool, "c", "data.append(5)\nwhile True:\n    pass", timeout_s=1.0)
    assert r.status == "timeout"
    assert (await cell(pool, "c", "data")).value == "[1, 2, 3]"
    r = await cell(pool, "c", "data.append(6)\nraise ValueError('kept')")  # an exception is not a crash
    assert r.status == "error" and r.error_type == "ValueError"
    assert (await cell(pool, "c", "data")).value == "[1, 2, 3, 6]"


async def test_background_processes_of_a_cell_are_killed(pool):
    await cell(pool, "d", "import subprocess, sys\np = subprocess.Popen(['sleep', '300'])")
    # the live processes of the session (a zombie is dead: the old holder, killed when the last cell
    # took over, may still wait for the session's init to reap it)
    r = await cell(
        pool,
        "d",
        "import os\nstat = lambda p: open(f'/proc/{p}/stat').read()\n"
        "print(sorted(open(f'/proc/{p}/comm').read().strip() for p in os.listdir('/proc') "
        "if p.isdigit() and stat(p).rsplit(')', 1)[1].split()[0] != 'Z'))",
    )
    assert r.status == "ok", r
    names = eval(r.stdout)
    assert "sleep" not in names and len(names) == 3, names  # init, the holder, this cell


async def test_expired_and_evicted_sessions_get_a_clear_error():
    async with LocalPool(
        workers=1, limits=Limits(timeout_s=5), isolation=IsolationConfig(), max_sessions=2, session_idle_s=0.5
    ) as pool:
        assert (await cell(pool, "s1", "v = 1")).status == "ok"
        import asyncio

        await asyncio.sleep(1.0)
        r = await cell(pool, "s1", "v")
        assert r.status == "rejected" and "expired" in r.reason
    async with LocalPool(
        workers=1, limits=Limits(timeout_s=5), isolation=IsolationConfig(), max_sessions=2, session_idle_s=600
    ) as pool:
        for sid in ("s2", "s3", "s4"):
            assert (await cell(pool, sid, f"name = {sid!r}")).status == "ok"
        r = await cell(pool, "s2", "name")  # least recently used of three with a cap of two
        assert r.status == "rejected" and "evicted" in r.reason
        assert (await cell(pool, "s4", "name")).value == "'s4'"


async def test_closing_a_pool_ends_its_sessions():
    """The pool's own sandbox processes (descendants of its worker: other pools on the machine, a
    recipe's or another test's, are not counted) are the two session holders, and none is left."""
    before = set(sandbox_processes())
    async with LocalPool(workers=1, limits=Limits(timeout_s=5), isolation=IsolationConfig()) as pool:
        for sid in ("p1", "p2"):
            assert (await cell(pool, sid, "kept = 1")).status == "ok"
        worker = pool.handles[0].proc.pid
        mine = {p for p in sandbox_processes() if descends_from(p, worker)}
        assert len(mine) == 2, mine  # the two holders
    assert set(wait_no_sandbox_processes_except(before)) & mine == set()


@pytest.mark.parametrize("n", [12])
async def test_kth_cell_runs_only_itself(pool, n):
    """The released code replays every earlier cell; here a cell's CPU time does not depend on k."""
    for k in range(n):
        r = await cell(
            pool,
            "k",
            f"import time\nt = time.process_time()\nx{k} = sum(range(10_000))\ntime.process_time() - t",
        )
        assert r.status == "ok"
    # all n variables exist and the last cell saw only its own work (no replay of 11 earlier cells)
    assert (await cell(pool, "k", f"sum(1 for i in range({n}) if f'x{{i}}' in globals())")).value == str(n)

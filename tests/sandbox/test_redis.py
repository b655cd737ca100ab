"""Distributed mode with a real redis-server and real worker processes: killed workers, a Redis
restart, deadlines. Every call gets exactly one correct result."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import pytest
from redis.exceptions import ResponseError

from rstar2.sandbox import ExecRequest
from rstar2.sandbox.redis_queue import PASSWORD_ENV, TASKS, RedisBackend, exposed_warning, shown

from ..conftest import start_cli, stop

pytestmark = pytest.mark.redis
LIGHT = "math,fractions,itertools,collections"


def start_worker(url: str, lease_s: float = 2.0, name: str | None = None) -> object:
    extra = ["--name", name] if name else []
    return start_cli(
        [
            "sandbox",
            "worker",
            "--redis",
            url,
            "--workers",
            "1",
            "--lease-s",
            str(lease_s),
            "--preload",
            LIGHT,
            *extra,
        ],
        start_new_session=True,
    )


def kill_worker(proc) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the worker node and its sandbox workers, as a crashed node
    proc.wait()


async def gather_all(backend: RedisBackend, n: int, sleep_every: int = 0):
    reqs = []
    for i in range(n):
        pause = "import time; time.sleep(0.3)\n" if sleep_every and i % sleep_every == 0 else ""
        # a generous limit: these tests are about delivery, and the shared CI machine can starve a call
        reqs.append(ExecRequest(f"{pause}print({i} + 1000)", timeout_s=30))
    return await asyncio.gather(*(backend.run(r) for r in reqs))


def check_exactly_once(results, n: int) -> None:
    assert len(results) == n
    assert [r.status for r in results] == ["ok"] * n, [r.reason for r in results if r.status != "ok"][:5]
    assert [r.stdout for r in results] == [f"{i + 1000}\n" for i in range(n)]


async def test_calls_flow_through_redis_workers(redis_server):
    workers = [start_worker(redis_server.url) for _ in range(2)]
    backend = RedisBackend(redis_server.url, deadline_s=120)
    try:
        await backend.start()
        check_exactly_once(await gather_all(backend, 200), 200)
        r = await backend.run(ExecRequest("1", session_id="s"))
        assert r.status == "rejected" and "local pool" in r.reason
    finally:
        await backend.close()
        for w in workers:
            stop(w)


async def test_killed_worker_tasks_are_redelivered(redis_server):
    workers = [start_worker(redis_server.url, lease_s=2.0, name=f"node{i}") for i in range(2)]
    backend = RedisBackend(redis_server.url, deadline_s=240)

    async def held_by(consumer: str) -> int:
        try:
            rows = await backend._redis.xpending_range(
                TASKS, "workers", min="-", max="+", count=10_000, consumername=consumer
            )  # noqa: SLF001
        except ResponseError:  # the workers have not created the group yet
            return 0
        return len(rows)

    try:
        await backend.start()
        calls = asyncio.create_task(gather_all(backend, 150, sleep_every=3))
        for _ in range(300):  # kill node0 at a moment when it holds tasks
            await asyncio.sleep(0.05)
            if await held_by("node0") > 0:
                break
        kill_worker(workers[0])
        assert await held_by("node0") > 0  # the dead node took tasks with it
        results = await asyncio.wait_for(calls, 240)
        check_exactly_once(results, 150)
        assert await held_by("node0") == 0  # ... and they were claimed and run by the other node
        # nothing left unacknowledged once the surviving node is done (a re-delivered copy
        # whose first run already answered may still be running when the last result arrives)
        for _ in range(300):
            info = await backend._redis.xpending(TASKS, "workers")  # noqa: SLF001
            if info["pending"] == 0:
                break
            await asyncio.sleep(0.1)
        assert info["pending"] == 0, info
    finally:
        await backend.close()
        for w in workers:
            stop(w)


async def test_redis_restart_mid_run(redis_server):
    """Defined behaviour: without persistence the queue is lost with Redis; both sides reconnect and
    the service re-submits every call still waiting, so each call still gets exactly one result."""
    workers = [start_worker(redis_server.url) for _ in range(2)]
    backend = RedisBackend(redis_server.url, deadline_s=240)
    try:
        await backend.start()
        calls = asyncio.create_task(gather_all(backend, 120, sleep_every=2))
        await asyncio.sleep(2.0)
        redis_server.kill()
        await asyncio.sleep(1.0)
        redis_server.start()
        results = await asyncio.wait_for(calls, 240)
        check_exactly_once(results, 120)
        assert backend.resubmitted > 0
    finally:
        await backend.close()
        for w in workers:
            stop(w)


async def test_every_call_has_a_deadline(redis_server):
    backend = RedisBackend(redis_server.url, deadline_s=1.5)  # no worker is running
    try:
        t0 = time.monotonic()
        r = await backend.run(ExecRequest("print(1)"))
        assert r.status == "internal" and "deadline" in r.reason
        assert time.monotonic() - t0 < 60  # it returned instead of waiting forever
    finally:
        await backend.close()


async def test_service_in_redis_mode(redis_server):
    """`rstar2 sandbox serve --redis` in front of a worker node, end to end over HTTP."""
    import httpx

    from ..conftest import free_port, wait_http

    port = free_port()
    serve = start_cli(["sandbox", "serve", "--port", str(port), "--redis", redis_server.url])
    worker = start_worker(redis_server.url)
    try:
        wait_http(f"http://127.0.0.1:{port}", serve)
        r = httpx.post(
            f"http://127.0.0.1:{port}/run_batch",
            json={"requests": [{"code": f"{i} * 2"} for i in range(20)]},
            timeout=120,
        )
        assert [x["value"] for x in r.json()["results"]] == [str(i * 2) for i in range(20)]
    finally:
        stop(serve)
        stop(worker)


async def test_long_call_keeps_its_lease(redis_server):
    """A call running longer than the lease is renewed by its node, not run a second time elsewhere."""
    workers = [start_worker(redis_server.url, lease_s=3.0) for _ in range(2)]
    backend = RedisBackend(redis_server.url, deadline_s=120)
    try:
        await backend.start()
        check_exactly_once(await gather_all(backend, 4), 4)  # both nodes are up
        duplicates_before = backend.duplicates
        r = await backend.run(ExecRequest("import time\ntime.sleep(8)\nprint('once')", timeout_s=15))
        assert r.status == "ok" and r.stdout == "once\n"
        await asyncio.sleep(4.0)  # a second run elsewhere would have replied by now
        assert backend.duplicates == duplicates_before
    finally:
        await backend.close()
        for w in workers:
            stop(w)


async def test_a_redis_with_a_password_serves_only_those_who_give_it(tmp_path, monkeypatch):
    """``redis-server --requirepass``: a worker with a wrong or no password stops at once with the
    server's words (a refused password is not an outage to wait through), the backend's calls fail
    saying so; the right one, in the URL or in ``$RSTAR2_REDIS_PASSWORD``, runs calls."""
    from ..conftest import ROOT, RSTAR2, RedisServer, free_port, need_redis_server

    server = RedisServer(need_redis_server(), free_port(), tmp_path, password="right-horse")
    server.start()
    bare = server.url.replace(":right-horse@", "")
    try:
        for url, why in (
            (server.url.replace("right-horse", "wrong"), "invalid username-password pair"),
            (bare, "authenticated"),
        ):
            env = {k: v for k, v in os.environ.items() if k != PASSWORD_ENV}
            args = [*RSTAR2, "sandbox", "worker", "--redis", url, "--workers", "1", "--preload", LIGHT]
            run = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
            said = " ".join(run.stdout.split()) + " ".join(run.stderr.split())
            assert run.returncode == 2 and "refused this client" in said and why in said, said[-2000:]
            assert "Traceback" not in said
        wrong = RedisBackend(server.url.replace("right-horse", "wrong"), deadline_s=30)
        try:
            r = await wrong.run(ExecRequest("print(1)"))
            assert r.status == "internal" and "refused this client" in r.reason, r.reason
        finally:
            await wrong.close()
        monkeypatch.setenv(PASSWORD_ENV, "right-horse")
        worker = start_worker(bare)  # the password from the environment, not the command line
        backend = RedisBackend(server.url, deadline_s=120)
        try:
            check_exactly_once(await gather_all(backend, 20), 20)
        finally:
            await backend.close()
            stop(worker)
    finally:
        server.kill()


def test_a_routable_redis_without_a_password_is_warned_about(monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    assert "has no password" in exposed_warning("redis://10.0.0.5:6379/0")
    assert exposed_warning("redis://:pw@10.0.0.5:6379/0") is None
    assert exposed_warning("redis://127.0.0.1:6379/0") is None
    monkeypatch.setenv(PASSWORD_ENV, "pw")
    assert exposed_warning("rediss://10.0.0.5:6379/0") is None
    assert shown("redis://:pw@10.0.0.5:6379/0") == "redis://:***@10.0.0.5:6379/0"

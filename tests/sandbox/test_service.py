"""The HTTP service as a user runs it: a real `rstar2 sandbox serve` process on loopback."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from rstar2.sandbox.client import Client

from ..conftest import free_port, start_cli, stop, wait_http


@pytest.fixture(scope="module")
def service():
    port = free_port()
    # a light worker (no numpy/sympy) keeps the 10,000-call test short on a small CI machine
    proc = start_cli(
        [
            "sandbox",
            "serve",
            "--port",
            str(port),
            "--workers",
            "2",
            "--timeout",
            "5",
            "--preload",
            "math,fractions,itertools,collections",
        ]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url, proc)
        yield url
    finally:
        stop(proc)


def test_run_and_health(service):
    r = httpx.post(service + "/run", json={"code": "print(input()[::-1])", "input": "olleh"}, timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["stdout"] == "hello\n"
    assert set(body) >= {
        "status",
        "stdout",
        "stderr",
        "value",
        "exit_code",
        "signal",
        "duration_s",
        "truncated",
    }
    assert httpx.get(service + "/health").json()["status"] == "ok"


def test_batch_keeps_order(service):
    reqs = [{"code": f"{i} ** 2"} for i in range(50)] + [
        {"code": "1/0"},
        {"code": "while True: pass", "timeout_s": 0.5},
    ]
    r = httpx.post(service + "/run_batch", json={"requests": reqs}, timeout=60)
    results = r.json()["results"]
    assert [x["value"] for x in results[:50]] == [str(i * i) for i in range(50)]
    assert results[50]["status"] == "error" and results[51]["status"] == "timeout"


@pytest.mark.parametrize(
    "payload, fragment",
    [
        ({"code": 123}, "code"),
        ({"code": "1", "timeout_s": "ten"}, "timeout_s"),
        ({"code": "1", "timeout_s": -1}, "timeout_s"),
        ({"code": "1", "memory_mb": 10**9}, "memory_mb"),
        ({"code": "1", "unknown": 1}, "unknown"),
        ({"input": "no code"}, "code"),
        ({"code": "x" * (256 * 1024 + 1)}, "code"),
        ({"code": "1", "session_id": "../../etc"}, "session_id"),
    ],
)
def test_bad_requests_get_a_4xx_that_says_what(service, payload, fragment):
    r = httpx.post(service + "/run", json=payload, timeout=30)
    assert r.status_code == 422
    assert fragment in r.json()["error"]


def test_malformed_json_and_oversized_batch(service):
    r = httpx.post(service + "/run", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    r = httpx.post(service + "/run_batch", json={"requests": [{"code": "1"}] * 50_001}, timeout=60)
    assert r.status_code == 422 and "requests" in r.json()["error"]
    r = httpx.post(service + "/run_batch", json={"requests": "nope"})
    assert r.status_code == 422


def test_service_survives_hostile_code(service):
    hostile = [
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "import sys\nfor _ in range(2000):\n    sys.stdout.write('y' * 100_000)",
        "a = bytearray(10 * 1024**3)",
        "import ctypes\nctypes.string_at(0)",
    ]
    r = httpx.post(
        service + "/run_batch", json={"requests": [{"code": c, "timeout_s": 2} for c in hostile]}, timeout=120
    )
    statuses = [x["status"] for x in r.json()["results"]]
    assert "internal" not in statuses, statuses
    assert (
        httpx.post(service + "/run", json={"code": "print('alive')"}, timeout=30).json()["stdout"]
        == "alive\n"
    )


def test_metrics_in_prometheus_format(service):
    httpx.post(service + "/run", json={"code": "1"}, timeout=30)
    text = httpx.get(service + "/metrics").text
    for name in (
        "rstar2_sandbox_queue_depth",
        "rstar2_sandbox_in_flight",
        "rstar2_sandbox_latency_seconds_bucket",
        'rstar2_sandbox_calls_total{status="ok"}',
    ):
        assert name in text


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_10000_calls_at_concurrency_256(service):
    sem = asyncio.Semaphore(256)
    async with Client(service, batch_size=64, concurrency=16) as client:

        async def one(i: int):
            async with sem:
                return await client.run(f"print({i} * 3)")

        results = await asyncio.gather(*(one(i) for i in range(10_000)))
    assert len(results) == 10_000
    assert [r.stdout for r in results] == [f"{i * 3}\n" for i in range(10_000)]


async def test_client_retries_until_the_service_is_up():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with Client(url, retries=8, retry_for_s=300) as client:
        task = asyncio.create_task(client.run("print('late')"))
        await asyncio.sleep(0.5)
        proc = start_cli(["sandbox", "serve", "--port", str(port), "--workers", "1"])
        try:
            result = await asyncio.wait_for(task, 180)
        finally:
            stop(proc)
    assert result.status == "ok" and result.stdout == "late\n"


async def test_client_reports_an_unreachable_service():
    async with Client(f"http://127.0.0.1:{free_port()}", retries=1, retry_for_s=0) as client:
        result = await client.run("1")
    assert result.status == "internal" and "unreachable" in result.reason


async def test_client_reports_rejected_requests(service):
    async with Client(service) as client:
        result = await client.run("1", timeout_s=-5)
    assert result.status == "rejected" and "timeout_s" in result.reason

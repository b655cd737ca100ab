"""The HTTP service: `POST /run`, `POST /run_batch`, `GET /health`, `GET /metrics`.

It runs untrusted code: it binds to loopback by default, asks for its API key when given one
(``rstar2.auth``: every route but ``/health``), and must never be exposed to a network you do not
control. User input never causes a 500: bad requests get a 4xx that says what is wrong,
and everything that goes wrong while running code becomes a structured `ExecResult`.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, Field

from ..auth import key_guard
from .request import MAX_MEMORY_MB, MAX_TIMEOUT_S, MIN_MEMORY_MB, ExecRequest
from .result import STATUSES, ExecResult

MAX_CODE_CHARS = 256 * 1024
MAX_INPUT_CHARS = 1024 * 1024
MAX_BATCH = 50_000


class Backend(Protocol):
    """Where calls run: the local pool, or Redis-backed worker nodes."""

    async def start(self) -> object: ...
    async def close(self) -> None: ...
    async def run(self, req: ExecRequest) -> ExecResult: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def in_flight(self) -> int: ...


class RunBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    code: str = Field(max_length=MAX_CODE_CHARS)
    input: str = Field(default="", max_length=MAX_INPUT_CHARS)
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)
    memory_mb: int | None = Field(default=None, ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB)
    session_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")

    def to_request(self) -> ExecRequest:
        return ExecRequest(self.code, self.input, self.timeout_s, self.memory_mb, self.session_id)


class BatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    requests: list[RunBody] = Field(max_length=MAX_BATCH)


def _error_text(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "; ".join(parts[:10])


def create_app(backend: Backend, api_key: str | None = None) -> FastAPI:
    registry = CollectorRegistry()
    depth = Gauge("rstar2_sandbox_queue_depth", "calls waiting for a worker", registry=registry)
    depth.set_function(lambda: backend.queue_depth)
    running = Gauge("rstar2_sandbox_in_flight", "calls running now", registry=registry)
    running.set_function(lambda: backend.in_flight)
    latency = Histogram(
        "rstar2_sandbox_latency_seconds",
        "end-to-end latency of a call in the service",
        buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        registry=registry,
    )
    calls = Counter("rstar2_sandbox_calls", "calls by status", ["status"], registry=registry)
    for status in STATUSES:
        calls.labels(status)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await backend.start()
        yield
        await backend.close()

    app = FastAPI(title="rstar2 sandbox", lifespan=lifespan)
    app.middleware("http")(key_guard(api_key))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"error": _error_text(exc), "detail": exc.errors()[:10]})

    async def _run(req: ExecRequest) -> ExecResult:
        t0 = time.monotonic()
        try:
            result = await backend.run(req)
        except Exception as exc:  # noqa: BLE001 - the service keeps serving
            result = ExecResult.failure("internal", f"backend error: {exc!r}")
        latency.observe(time.monotonic() - t0)
        calls.labels(result.status).inc()
        return result

    @app.post("/run")
    async def run(body: RunBody) -> dict:
        return (await _run(body.to_request())).to_dict()

    @app.post("/run_batch")
    async def run_batch(body: BatchBody) -> dict:
        results = await asyncio.gather(*(_run(r.to_request()) for r in body.requests))
        return {"results": [r.to_dict() for r in results]}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "queue_depth": backend.queue_depth, "in_flight": backend.in_flight}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app

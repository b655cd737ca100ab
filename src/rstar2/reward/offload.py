"""Run answer checks on the code environment's workers, as the paper does: each CAS check is a tiny
program whose sandbox limits are its time box and memory cap, so a pathological answer never costs
the trainer. Start the sandbox with ``--preload default,rstar2.reward.equivalence`` for speed."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from typing import Protocol

from ..config import DEFAULT_ROLLOUT
from ..sandbox.request import DEFAULT_LIMITS, ExecRequest
from ..sandbox.result import ExecResult
from .equivalence import Verdict, check_answer, triage
from .extract import Mode
from .verifier_pool import DEFAULT_TIMEOUT_S


class Sandbox(Protocol):
    async def run_many(self, requests: list[ExecRequest | str]) -> list[ExecResult]: ...


def check_payload(payload: str) -> None:
    """Entry point inside the sandbox: decode one pair, print its verdict as JSON."""
    data = json.loads(base64.b64decode(payload))
    print(json.dumps(check_answer(data["reference"], data["answer"]).to_dict()))


def program_for(reference: str, answer: str) -> str:
    payload = base64.b64encode(json.dumps({"reference": reference, "answer": answer}).encode()).decode()
    return f"from rstar2.reward.offload import check_payload\ncheck_payload({payload!r})\n"


def verdict_from_result(result: ExecResult, answer: str, seconds: float) -> Verdict:
    if result.status == "ok":
        try:
            verdict = Verdict.from_dict(json.loads(result.stdout.strip().splitlines()[-1]))
            verdict.seconds = seconds
            return verdict
        except (ValueError, IndexError, TypeError):
            return Verdict(False, "unreadable verdict from sandbox", answer, "error", seconds)
    if result.status == "timeout":
        return Verdict(False, "timeout", answer, "timeout", seconds)
    detail = result.error_type or result.status
    return Verdict(False, f"sandbox {result.status}: {detail}", answer, "error", seconds)


@dataclass
class SandboxVerifier:
    """``await check(reference, response)`` with the CAS step executed in a sandbox."""

    sandbox: Sandbox
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_LIMITS.memory_mb
    mode: Mode = DEFAULT_ROLLOUT.verify_mode

    async def check(self, reference: str, response: str, *, extracted: bool = False) -> Verdict:
        return (await self.check_many([(reference, response)], extracted=extracted))[0]

    async def check_many(self, pairs: list[tuple[str, str]], *, extracted: bool = False) -> list[Verdict]:
        start = time.perf_counter()
        verdicts: list[Verdict | None] = []
        remote: list[tuple[int, str, str]] = []
        for reference, response in pairs:
            verdict, answer = triage(reference, response, mode=self.mode, extracted=extracted)
            if verdict is None:
                remote.append((len(verdicts), str(reference), str(answer)))
            verdicts.append(verdict)
        if remote:
            requests = [
                ExecRequest(program_for(ref, ans), timeout_s=self.timeout_s, memory_mb=self.memory_mb)
                for _, ref, ans in remote
            ]
            results = await self.sandbox.run_many(requests)  # type: ignore[arg-type]
            elapsed = time.perf_counter() - start
            for (i, _, ans), result in zip(remote, results, strict=True):
                verdicts[i] = verdict_from_result(result, ans, elapsed)
        return [v for v in verdicts if v is not None]

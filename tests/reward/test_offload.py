"""Checks offloaded to the code environment's workers (a real LocalPool)."""

import pytest

from rstar2.reward import SandboxVerifier
from rstar2.sandbox import LocalPool
from rstar2.sandbox.zygote import PRELOAD


@pytest.fixture(scope="module")
async def sandbox():
    pool = LocalPool(workers=1, preload=[*PRELOAD, "rstar2.reward.equivalence"])
    await pool.start()
    yield pool
    await pool.close()


async def test_checks_run_on_sandbox_workers(sandbox):
    verifier = SandboxVerifier(sandbox, timeout_s=20.0)
    pairs = [
        ("117", "<answer>\\boxed{117}</answer>"),  # fast path, stays local
        ("\\frac{\\sqrt{3}}{3}", "<answer>\\boxed{\\frac{1}{\\sqrt3}}</answer>"),  # CAS in the sandbox
        ("(3,4]", "<answer>\\boxed{[3,4]}</answer>"),
        ("\\text{(C)}", "<answer>\\boxed{C}</answer>"),
        ("5", "no answer here"),
    ]
    verdicts = await verifier.check_many(pairs)
    assert [v.correct for v in verdicts] == [True, True, False, True, False]
    assert [v.path for v in verdicts] == ["fast", "cas", "cas", "text", "none"]


async def test_a_slow_check_is_a_sandbox_timeout(sandbox):
    verifier = SandboxVerifier(sandbox, timeout_s=1.0)
    verdict = await verifier.check("2", "<answer>\\boxed{\\prod_{k=1}^{100000} (1+1/k) - 100000}</answer>")
    assert not verdict.correct and verdict.path == "timeout"
    # the sandbox still serves
    assert (await sandbox.run("print(6*7)")).stdout.strip() == "42"

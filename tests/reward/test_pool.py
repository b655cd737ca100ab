"""The time box, the input guards and the health of the checking processes."""

import os
import signal
import time

import pytest

from rstar2.reward import VerifierPool, verify_answer, verify_batch

ADVERSARIAL = {
    "power tower": "<answer>\\boxed{9^9^9^9}</answer>",
    "braced tower": "<answer>\\boxed{9^{9^{9^{9}}}}</answer>",
    "huge factorial": "<answer>\\boxed{100000!}</answer>",
    "nesting 1000 deep": "<answer>\\boxed{" + "(" * 1000 + "1" + ")" * 1000 + "}</answer>",
    "braces 1000 deep": "<answer>\\boxed{" + "{" * 1000 + "1" + "}" * 1000 + "}</answer>",
    "10 MB response": "<reason>" + "la " * 3_500_000 + "</reason><answer>\\boxed{34}</answer>",
    "10,000 unclosed boxes": "<answer>" + "\\boxed{" * 10_000 + "</answer>",
    "a million digits": "<answer>\\boxed{" + "7" * 1_000_000 + "}</answer>",
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_answers_are_refused_and_the_pool_stays_healthy(verifier, name):
    verdict = verifier.check("33", ADVERSARIAL[name])
    assert not verdict.correct
    assert verdict.path != "timeout", verdict  # answered by the guards, not by the time box
    # the pool still grades a CAS pair correctly afterwards
    assert verifier.check("\\frac{\\sqrt{2}}{2}", "<answer>\\boxed{\\frac{1}{\\sqrt{2}}}</answer>").correct


def _pids(pool: VerifierPool) -> list[int]:
    """Process ids of the pool's live checkers."""
    return [w.pid for w in list(pool._workers) if w is not None]


def _live(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # it exited between the two looks
        return False


SLOW = "<answer>\\boxed{\\prod_{k=1}^{100000} (1+1/k) - 100000}</answer>"  # passes the guards, sympy grinds


def test_a_check_over_the_time_box_is_not_equivalent_and_its_worker_is_replaced(verifier):
    timeouts, replaced = verifier.stats.timeouts, verifier.stats.replaced
    verdict = verifier.check("2", SLOW, timeout_s=1.0)
    assert verdict.path == "timeout" and not verdict.correct and verdict.reason == "timeout"
    assert verifier.stats.timeouts == timeouts + 1 and verifier.stats.replaced == replaced + 1
    # the replacement (and the other worker) grade correctly
    checks = [verifier.submit("\\sqrt{8}", "<answer>\\boxed{2\\sqrt{2}}</answer>") for _ in range(4)]
    assert all(f.result().correct for f in checks)
    assert verifier.stats.timeouts == timeouts + 1


def test_a_killed_worker_fails_only_its_own_check():
    with VerifierPool(1, timeout_s=60.0) as pool:
        assert pool.check("\\sqrt{8}", "<answer>\\boxed{2\\sqrt{2}}</answer>").correct
        before = set(_pids(pool))
        slow = pool.submit("2", SLOW)
        time.sleep(0.5)  # the worker is now grinding on the slow check
        ours = _pids(pool)
        assert len(ours) == 1 and ours[0] in before
        os.kill(ours[0], signal.SIGKILL)
        verdict = slow.result(timeout=60)
        assert not verdict.correct and verdict.reason == "verifier worker died"
        assert pool.stats.worker_deaths == 1
        assert pool.check("\\frac{1}{2}", "<answer>\\boxed{\\sqrt{\\frac14}}</answer>").correct


def test_closing_the_pool_leaves_no_worker_behind():
    pool = VerifierPool(2, timeout_s=30.0).start()
    assert pool.check("\\pi", "<answer>\\boxed{\\frac{2\\pi}{2}}</answer>").correct
    workers = _pids(pool)
    assert len(workers) == 2 and all(_live(p) for p in workers)
    pool.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_live(p) for p in workers):
        time.sleep(0.1)
    assert not any(_live(p) for p in workers)
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit("1", "<answer>\\boxed{\\sqrt{1}}</answer>")


def test_verify_answer_and_verify_batch():
    assert verify_answer("117", "<reason>r</reason><answer>\\boxed{117}</answer>")
    assert not verify_answer("117", "<answer>\\boxed{118}</answer>")
    assert not verify_answer("117", "\\boxed{117}")  # strict: no <answer> block
    assert verify_answer("117", "\\boxed{117}", mode="lenient")
    pairs = [
        ("\\frac{1}{2}", "<answer>\\boxed{0.5}</answer>"),
        ("3", "<answer>\\boxed{\\sqrt{9}}</answer>"),
        ("4", "x"),
    ]
    verdicts = verify_batch(pairs, workers=2)
    assert [bool(v) for v in verdicts] == [True, True, False]
    assert [v.path for v in verdicts] == ["fast", "cas", "none"]


async def test_acheck_from_asyncio(verifier):
    verdict = await verifier.acheck("(1,2)", "<answer>\\boxed{(1, 2)}</answer>")
    assert verdict.correct


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="timeout_s"):
        VerifierPool(1, timeout_s=0)


def test_checkers_run_under_the_memory_cap(verifier):
    assert verifier.check("\\sqrt{8}", "<answer>\\boxed{2\\sqrt{2}}</answer>").correct
    for pid in _pids(verifier):
        with open(f"/proc/{pid}/limits") as f:
            line = next(row for row in f if row.startswith("Max address space"))
        assert line.split()[3] == str(verifier.memory_mb * 1024 * 1024), line

"""The reward: ``verify_answer(reference, response)`` is the 0/1 reward of GRPO-RoC. Plain numbers
are decided in the caller's process; a CAS check runs in a time-boxed process (``VerifierPool``),
or on the code environment's workers (``SandboxVerifier``)."""

from __future__ import annotations

from ..config import DEFAULT_ROLLOUT
from .equivalence import Verdict, check_answer, quick_check, triage
from .extract import Mode, extract_answer, last_boxed
from .offload import SandboxVerifier
from .verifier_pool import VerifierPool, default_pool, verify_batch


def verify_answer(reference: str, response: str, *, mode: Mode = DEFAULT_ROLLOUT.verify_mode) -> bool:
    """True iff the final answer in ``response`` equals ``reference`` (2 s time box per check, on the
    shared default pool)."""
    return default_pool().check(reference, response, mode=mode).correct


__all__ = [
    "SandboxVerifier",
    "Verdict",
    "VerifierPool",
    "check_answer",
    "default_pool",
    "extract_answer",
    "last_boxed",
    "quick_check",
    "triage",
    "verify_answer",
    "verify_batch",
]

"""Whether an engine computes the weights it says it took: after each load the trainer scores the
tokens the engine sampled for a fixed probe, and compares the engine's log-probs with the new
policy's and with the previous one's. A server's word (its version, a fingerprint of stored
tensors) is not enough: one that stores an adapter and does not apply it, or keeps serving its old
weights, states the right number.

The tolerance is each engine's own: its honest gap, measured on the run's first load (when it and
the trainer hold the same weights), times ``MARGIN``, never below ``FLOOR`` (a gap of 1e-8 is
rounding, and the next probe's may be ten times that) nor above ``rollout.engine.weight_check_tol``
(an engine further than that at the start computes another model). An engine further than its
tolerance from the new policy, or nearer the previous policy than the new one where the update
moved the probe's log-probs by more than its tolerance, does not serve the new weights."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

MARGIN = 10.0
FLOOR = 1e-4  # nats: below this an update's effect is within any engine's rounding


@dataclass
class Probe:
    """One engine's answer to the probe: the tokens it sampled, its log-probs of them, and the
    trainer's under the policy it was sent."""

    tokens: list[int]
    engine: list[float]
    trainer: list[float]

    @property
    def gap(self) -> float:
        return mean_gap(self.engine, self.trainer)


def mean_gap(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a) if a else 0.0


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def tolerance(honest_gap: float, cap: float) -> float:
    """An engine's tolerance from its honest gap (see the module's docstring)."""
    return min(cap, max(FLOOR, MARGIN * honest_gap))


def verdict(now: Probe, before: Probe | None, tol: float) -> str | None:
    """Why the engine does not serve the policy it was sent (None: it does). ``before``: its answer
    to the same probe (same prompt and seed) after the previous load; where the new answer's tokens
    are the same as before, the engine's log-probs are compared with both policies'."""
    if now.gap > tol:
        return f"mean |logprob difference| to the trainer's {now.gap:.3g} > its tolerance {tol:.3g}"
    n = common_prefix(now.tokens, before.tokens) if before is not None else 0
    if n == 0:
        return None
    assert before is not None
    to_new = mean_gap(now.engine[:n], now.trainer[:n])
    to_old = mean_gap(now.engine[:n], before.trainer[:n])
    moved = mean_gap(now.trainer[:n], before.trainer[:n])
    if moved > tol and to_old < to_new:
        return (
            f"it samples nearer the previous policy than the new one (mean |logprob difference| "
            f"{to_old:.3g} to the previous, {to_new:.3g} to the new, over {n} probe tokens)"
        )
    return None


@dataclass
class ContentCheck:
    """The run's record of each engine (by name): its tolerance, set at its first probe, and its
    last answer that passed."""

    cap: float
    tolerances: dict[str, float] = field(default_factory=dict)
    last: dict[str, Probe] = field(default_factory=dict)

    def judge(self, name: str, probe: Probe) -> str | None:
        """Why engine ``name`` does not serve the weights just sent, or None (then this answer is
        the one the next load is compared with)."""
        if name not in self.tolerances:
            if probe.gap > self.cap:
                return (
                    f"at its first load its log-probs differ from the trainer's by {probe.gap:.3g} on "
                    f"average (> rollout.engine.weight_check_tol {self.cap}): it computes another model"
                )
            self.tolerances[name] = tolerance(probe.gap, self.cap)
            print(
                f"[rstar2] engine {name}: {probe.gap:.3g} nats from the trainer at its first load; "
                f"each later load is checked within {self.tolerances[name]:.3g}",
                file=sys.stderr,
            )
        why = verdict(probe, self.last.get(name), self.tolerances[name])
        if why is None:
            self.last[name] = probe
        return why


def untrue_turn(traj: Any, untrue: dict[str, int]) -> str | None:
    """Why ``traj`` holds tokens an engine sampled after a load it said it took and did not serve
    (``untrue``: engine name → the version it did not serve; its tokens are labelled with it or a
    later one: at k > 0 some are sampled while the probe runs), or None."""
    if not untrue:
        return None
    end = 0
    for turn in traj.turns:
        start, end = end, end + turn.model_tokens
        since = untrue.get(turn.engine)
        if since is not None and any(v >= since for v in traj.versions[start:end]):
            return f"sampled by engine {turn.engine}, which does not serve the weights of version {since}"
        end += turn.tool_tokens
    return None

"""Whether an engine computes the weights it says it took: after each load the trainer scores the
tokens the engine sampled for a fixed probe, and compares the engine's log-probs with the new
policy's and with the previous one's. A server's word (its version, a fingerprint of stored
tensors) is not enough: one that stores an adapter and does not apply it states the right number.

The tolerance is each engine's own: its honest gap at the run's first load (when it and the trainer
hold the same weights) times ``MARGIN``, never below ``FLOOR`` (a gap of 1e-8 is rounding, and the
next probe's may be ten times that) nor above ``rollout.engine.weight_check_tol`` (further than that
at the start, it computes another model). An engine further than its tolerance from the new policy,
or nearer the previous policy than the new one where the update moved the probe by more than its
tolerance, does not serve the new weights."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

MARGIN = 10.0
FLOOR = 1e-4  # nats: below this an update's effect is within any engine's rounding


@dataclass
class Probe:
    """One engine's answer to the probe: its tokens, its log-probs and the trainer's of them."""

    tokens: list[int]
    engine: list[float]
    trainer: list[float]

    @property
    def gap(self) -> float:
        return mean_gap(self.engine, self.trainer)


def mean_gap(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a) if a else 0.0


def tolerance(honest_gap: float, cap: float) -> float:
    """An engine's tolerance from its honest gap (see the module's docstring)."""
    return min(cap, max(FLOOR, MARGIN * honest_gap))


def verdict(now: Probe, before: Probe | None, tol: float) -> str | None:
    """Why the engine does not serve the policy it was sent (None: it does). ``before``: its answer to
    the same probe after the previous load; on the tokens they share, it is compared with both policies."""
    if now.gap > tol:
        return f"mean |logprob difference| to the trainer's {now.gap:.3g} > its tolerance {tol:.3g}"
    # the tokens both answers share (``commonprefix`` compares any sequences, not only paths)
    if before is None or not (n := len(os.path.commonprefix([now.tokens, before.tokens]))):
        return None
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
    """Each engine's tolerance, set at its first probe, and its last answer that passed, by name."""

    cap: float
    tolerances: dict[str, float] = field(default_factory=dict)
    last: dict[str, Probe] = field(default_factory=dict)

    def judge(self, name: str, probe: Probe) -> str | None:
        """Why engine ``name`` does not serve the weights just sent, or None (this answer is kept)."""
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
    """Why ``traj`` holds tokens an engine sampled after a load it did not serve (``untrue``: engine →
    that version; at k > 0 some of its tokens are sampled while the probe runs), or None."""
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

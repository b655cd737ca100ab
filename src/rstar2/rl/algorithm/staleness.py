"""Bounded staleness: which groups may start, which tokens may be trained, how old they were.

Group ``i`` is trained at step ``i // batch_size`` by the policy of that version. It may start while
the policy is at version ``v`` only if ``i // batch_size - v <= k`` (``asynchronous.max_staleness``),
so every token it samples is at most ``k`` updates older than the policy it trains: the bound is
kept at admission, and no finished rollout is thrown away."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def admissible(group: int, *, version: int, batch_size: int, max_staleness: int) -> bool:
    """May group ``group`` start while the policy is at ``version``?"""
    return group // batch_size - version <= max_staleness


class StalenessError(RuntimeError):
    """A step would train on tokens sampled outside [version - k, version]."""


def check_versions(trajectories: Sequence[Any], *, trained_by: int, max_staleness: int) -> None:
    """A ``StalenessError`` naming the engine of the first model token not sampled by a version in
    [trained_by - max_staleness, trained_by] (-1: its engine did not report it). The bound never
    reaches below version 0, so an unreported token is refused in the first ``k`` steps too."""
    low = max(0, trained_by - max_staleness)
    for t in trajectories:
        at = 0
        for turn in t.turns:
            for v in t.versions[at : at + turn.model_tokens]:
                if not low <= v <= trained_by:
                    why = (
                        "its engine did not report it"
                        if v < 0
                        else "it holds other weights than the trainer sent"
                        if v > trained_by
                        else "older than the bound lets a group start with"
                    )
                    raise StalenessError(
                        f"engine {turn.engine or '?'} sampled a token with policy version {v}, outside "
                        f"[{low}, {trained_by}] (the trainer is at version {trained_by}, "
                        f"asynchronous.max_staleness={max_staleness}): {why}; the step was not trained"
                    )
            at += turn.model_tokens + turn.tool_tokens


def staleness_metrics(versions: Sequence[Sequence[int]], trained_by: int) -> dict[str, float]:
    """The mean and largest lag of trained tokens behind ``trained_by`` (``versions``: per trajectory,
    its model tokens' versions), the share of trajectories spanning two or more versions, and the
    count of tokens with no reported version (-1): counted, not skipped, so a gap in the check shows."""
    lags = [trained_by - v for vs in versions for v in vs if v >= 0]
    spans = [len({v for v in vs if v >= 0}) > 1 for vs in versions]
    return {
        "staleness/mean": statistics.fmean(lags) if lags else 0.0,
        "staleness/max": float(max(lags, default=0)),
        "staleness/multi_version_share": statistics.fmean(spans) if spans else 0.0,
        "staleness/unreported_tokens": float(sum(v < 0 for vs in versions for v in vs)),
    }

"""A step's rows to train: RoC's choice in each group of rollouts, then the group-normalised
advantages of those kept; the seeds that make the choice the same wherever it is redone."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from ...config import RLConfig
from .grpo import group_advantages
from .roc import GroupChoice, Scored, roc_select, score

if TYPE_CHECKING:
    from ...rollout.trajectory import Trajectory


class Row(NamedTuple):
    """A rollout RoC kept, with its advantage and the index of its group (for per-group losses)."""

    trajectory: Trajectory
    advantage: float
    group: int


class Selection(NamedTuple):
    """What RoC made of a step's groups: the rollouts without faults, their scores, choices and rows."""

    groups: list[list[Trajectory]]
    scored: list[list[Scored]]
    choices: list[GroupChoice]
    rows: list[Row]


def seed_of(*parts: int) -> int:
    """A seed for (run seed, step, group, ...): sampling and RoC's choices are redone alike wherever
    a group ran, on a resumed run, and in ``rstar2 replay``."""
    return hash(tuple(parts)) % (2**31 - 1)


def select_rows(
    sampled: Sequence[Sequence[Trajectory]], group_ids: Sequence[int], step: int, cfg: RLConfig
) -> Selection:
    """RoC keeps G of each group's 2G, then group-normalised advantages (the trainer's and replay's)."""
    groups = [[t for t in g if t.fault is None] for g in sampled]
    r = cfg.roc
    scored = [[score(t, r.error_penalty, r.format_penalty, r.format_turns) for t in g] for g in groups]
    # RoC's random choices in each group, by its index in the step over all processes
    choices = roc_select(scored, r, [random.Random(seed_of(cfg.run.seed, step, g, 1)) for g in group_ids])
    kept = [[g[i] for i in c.kept] for g, c in zip(groups, choices, strict=True)]
    advantages = group_advantages(
        [[t.reward for t in g] for g in kept], cfg.loss.adv_eps, cfg.loss.scale_by_std
    )
    rows = [
        Row(t, a, gi)
        for gi, (g, adv) in enumerate(zip(kept, advantages, strict=True))
        for t, a in zip(g, adv, strict=True)
    ]
    return Selection(groups, scored, choices, rows)

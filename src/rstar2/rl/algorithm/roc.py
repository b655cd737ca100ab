"""Resample-on-Correct (RoC): keep G of the 2G rollouts of a problem. Correct ones are ranked by a
penalty (tool errors + format faults) and the cleanest kept, so a right answer does not excuse
crashing code; incorrect ones are kept at random, because their variety is the learning signal."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ...chat.tags import ANSWER_CLOSE, ANSWER_OPEN
from ...config import DEFAULT_ROC, RocSection

Mode = Literal["lowest", "weighted", "uniform"]

_ANSWER_PAIR = re.compile(re.escape(ANSWER_OPEN) + ".*?" + re.escape(ANSWER_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class Scored:
    """What RoC needs to know of one rollout: plain numbers, so every rule can be checked by hand."""

    reward: float
    p_err: float = 0.0
    p_format: float = 0.0

    @property
    def correct(self) -> bool:
        return self.reward > 0

    @property
    def penalty(self) -> float:
        return self.p_err + self.p_format


def error_penalty(num_calls: int, num_failed: int) -> float:
    """Failed tool calls / tool calls; 0.5 without any call (the paper's nudge towards using the tool)."""
    return 0.5 if num_calls == 0 else num_failed / num_calls


def format_penalty(num_answers: int, num_turns: int) -> float:
    """1 without an answer, else min(1, (answers - 1) / turns): a repeated answer is a format fault."""
    if num_answers == 0 or num_turns == 0:
        return 1.0
    return min(1.0, (num_answers - 1) / num_turns)


def count_answers(text: str) -> int:
    """Complete ``<answer>…</answer>`` blocks in what the model wrote."""
    return len(_ANSWER_PAIR.findall(text))


FormatTurns = Literal["assistant", "tool_rounds"]


def score(
    traj, error: bool = True, fmt: bool = True, format_turns: FormatTurns = DEFAULT_ROC.format_turns
) -> Scored:
    """Penalties of a ``Trajectory`` from its tool statuses, never from grepping output: a malformed
    call or failing code is the model's; a call the environment could not serve counts neither way.
    ``format_turns``: what ``p_format`` divides by (every assistant turn: the paper's text; the turns
    with tool calls: the released code, where an answer without any call then gets 1.0)."""
    calls = traj.num_calls - traj.num_faulted_calls
    p_err = error_penalty(calls, traj.num_failed_calls) if error else 0.0
    turns = len(traj.turns) if format_turns == "assistant" else sum(bool(t.calls) for t in traj.turns)
    p_fmt = format_penalty(count_answers(traj.model_text), turns) if fmt else 0.0
    return Scored(traj.reward, p_err, p_fmt)


def class_counts(n_pos: int, n_neg: int, keep: int, min_per_class: int) -> tuple[int, int]:
    """Positives and negatives to keep: each class in proportion (round half to even: 2G → G is
    exactly half of each), the minority raised to ``min_per_class`` where it has that many. A group
    of at most ``keep``, or one whose minimums do not fit in ``keep``, is kept whole (as released)."""
    n = n_pos + n_neg
    if n <= keep:
        return n_pos, n_neg
    k_neg = round(n_neg * keep / n)
    k_pos = keep - k_neg
    floor_neg, floor_pos = min(min_per_class, n_neg), min(min_per_class, n_pos)
    if k_neg < floor_neg:
        k_neg, k_pos = floor_neg, keep - floor_neg
    if k_pos < floor_pos:
        k_pos, k_neg = floor_pos, keep - floor_pos
        if k_neg < floor_neg:
            return n_pos, n_neg
    return min(k_pos, n_pos), min(k_neg, n_neg)


def pick_positives(penalties: Sequence[float], k: int, mode: Mode, rng: random.Random) -> list[int]:
    """Indices of the k positives to keep. ``lowest``: ascending penalty, ties in rollout order (the
    released code); ``weighted``: drawn ∝ 1/penalty without replacement (the paper's text), zero
    penalties first; ``uniform``: the control that tells RoC's choice from its downsampling."""
    if k >= len(penalties):
        return list(range(len(penalties)))
    if mode == "lowest":
        return sorted(sorted(range(len(penalties)), key=lambda i: penalties[i])[:k])
    if mode == "uniform":
        return sorted(rng.sample(range(len(penalties)), k))
    clean = [i for i, p in enumerate(penalties) if p <= 0]
    if len(clean) >= k:
        return sorted(rng.sample(clean, k))
    chosen = list(clean)
    pool = [i for i, p in enumerate(penalties) if p > 0]
    while len(chosen) < k:
        weights = [1.0 / penalties[i] for i in pool]
        j = rng.choices(range(len(pool)), weights=weights)[0]
        chosen.append(pool.pop(j))
    return sorted(chosen)


@dataclass
class GroupChoice:
    kept: list[int]  # indices into the group, in rollout order
    dropped: str | None = None  # why nothing was kept: "all_correct" / "all_incorrect"


def select_group(group: Sequence[Scored], cfg: RocSection, rng: random.Random) -> GroupChoice:
    """RoC's choice in one group (``roc.enabled: false``: the whole group, plain GRPO)."""
    pos = [i for i, s in enumerate(group) if s.correct]
    neg = [i for i, s in enumerate(group) if not s.correct]
    if cfg.drop_equal_reward_groups and len({s.reward for s in group}) <= 1:
        return GroupChoice([], "all_correct" if pos else "all_incorrect")
    keep = cfg.keep if cfg.enabled else len(group)
    k_pos, k_neg = class_counts(len(pos), len(neg), keep, cfg.min_per_class)
    kept_pos = [pos[i] for i in pick_positives([group[i].penalty for i in pos], k_pos, cfg.mode, rng)]
    kept_neg = sorted(rng.sample(neg, k_neg))
    return GroupChoice(sorted(kept_pos + kept_neg))


def roc_select(
    groups: Sequence[Sequence[Scored]], cfg: RocSection, rng: random.Random | Sequence[random.Random]
) -> list[GroupChoice]:
    """RoC's choice in each group; ``rng``: one for all, or one per group (the trainer's, by its index)."""
    rngs = [rng] * len(groups) if isinstance(rng, random.Random) else list(rng)
    return [select_group(g, cfg, r) for g, r in zip(groups, rngs, strict=True)]


def roc_counts(choices: Sequence[GroupChoice]) -> dict[str, float]:
    """Groups seen, kept, and dropped for equal rewards (all correct, all incorrect)."""
    return {
        "roc/groups": float(len(choices)),
        "roc/groups_kept": float(sum(c.dropped is None for c in choices)),
        "roc/groups_all_correct": float(sum(c.dropped == "all_correct" for c in choices)),
        "roc/groups_all_incorrect": float(sum(c.dropped == "all_incorrect" for c in choices)),
    }

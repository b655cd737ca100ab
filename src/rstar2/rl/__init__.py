"""GRPO-RoC: Resample-on-Correct selection, GRPO advantages and loss, the RL and SFT trainers."""

from .grpo import group_advantages, policy_loss, token_logprobs, token_weights
from .roc import Scored, class_counts, error_penalty, format_penalty, roc_counts, roc_select, score

__all__ = [
    "Scored",
    "class_counts",
    "error_penalty",
    "format_penalty",
    "group_advantages",
    "policy_loss",
    "roc_counts",
    "roc_select",
    "score",
    "token_logprobs",
    "token_weights",
]

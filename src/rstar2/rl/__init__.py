"""GRPO-RoC: Resample-on-Correct selection, GRPO advantages and loss, the RL and SFT trainers."""

from .grpo import LossConfig, group_advantages, policy_loss, token_logprobs, token_weights
from .roc import RocConfig, Scored, class_counts, error_penalty, format_penalty, roc_select, score

__all__ = [
    "LossConfig",
    "RocConfig",
    "Scored",
    "class_counts",
    "error_penalty",
    "format_penalty",
    "group_advantages",
    "policy_loss",
    "roc_select",
    "score",
    "token_logprobs",
    "token_weights",
]

"""GRPO-RoC: Resample-on-Correct selection, GRPO advantages and loss, the RL and SFT trainers."""

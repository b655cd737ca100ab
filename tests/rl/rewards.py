"""A custom reward for the trainer tests (``reward: tests.rl.rewards:first_token_even``)."""


def first_token_even(traj) -> float:
    """1 when the first sampled token has an even id: learnable in a few steps from random weights
    when sampling from the model's top 4 tokens."""
    return float(bool(traj.response_ids) and traj.response_ids[0] % 2 == 0)

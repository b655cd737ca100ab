"""A custom reward for the trainer tests (``reward: tests.rl.rewards:first_token_even``)."""


def first_token_even(traj) -> float:
    """1 when the first sampled token has an even id: learnable in a few steps from random weights
    when sampling from the model's top 4 tokens."""
    return float(bool(traj.response_ids) and traj.response_ids[0] % 2 == 0)


def flat_when_a_multiple_of_three(traj) -> float:
    """``first_token_even``, except that "What is i + i?" with i a multiple of 3 always earns 1: those
    groups have no reward spread whatever the model writes (``roc.refill_groups`` replaces them)."""
    i = int(traj.problem.split()[2])
    return 1.0 if i % 3 == 0 else first_token_even(traj)

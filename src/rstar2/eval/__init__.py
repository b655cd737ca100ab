"""`rstar2 eval`: sample K trajectories per problem, score pass@1/pass@k/maj@k and tool use, report."""


class NothingMeasured(RuntimeError):
    """An evaluation in which every rollout failed: it measured nothing (``rstar2 eval`` exits 1)."""

"""`rstar2 eval`: sample K trajectories per problem, score pass@1/pass@k/maj@k and tool use, report."""

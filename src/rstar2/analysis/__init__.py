"""Looking inside runs: token entropy of trajectories, and a static trajectory viewer."""

"""What runs the algorithm: processes, checkpoints, the optimizer, data order, the feed of groups, engines and weight sync, metrics."""

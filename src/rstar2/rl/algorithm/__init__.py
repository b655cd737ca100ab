"""The algorithm of GRPO-RoC: advantages, RoC's choice, the loss, batches and the staleness rules; pure functions, no process, file or model."""

"""The in-process engine's KV budget when the settings leave it open (``rollout.engine``'s
``capacity_tokens`` and ``keep_tokens``): what the scheduler may grant, and what is kept for
trajectories' next turns. Apart from ``hf.py`` so that the command line's help can say it
without importing torch."""

from __future__ import annotations

CONTEXT_CAP = 4096  # tokens a row is budgeted at most, whatever the model's context
CAPACITY_HELP = f"batch size × min(model context, {CONTEXT_CAP})"
KEEP_HELP = "a quarter of the capacity"


def engine_budget(
    max_batch_size: int, context: int, capacity_tokens: int | None = None, keep_tokens: int | None = None
) -> tuple[int, int]:
    """(tokens the scheduler may grant, tokens kept for next turns) of an in-process engine:
    ``capacity_tokens`` in all (default CAPACITY_HELP), ``keep_tokens`` kept (default KEEP_HELP)."""
    total = capacity_tokens or max_batch_size * min(context, CONTEXT_CAP)
    keep = total // 4 if keep_tokens is None else keep_tokens
    if keep >= total:  # nothing left to grant: every request would wait forever
        raise ValueError(f"keep_tokens ({keep}) must leave room in the engine's {total} KV tokens")
    return total - keep, keep

"""Per-step metrics: one JSON object a line in ``metrics.jsonl``, TensorBoard events, Weights & Biases
(``run.wandb``), a PNG of curves. On resume, lines past the checkpoint (about to be redone) are
dropped: each step is in it once."""

from __future__ import annotations

import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

from ...chat.token_classes import CLASSES
from ...config import DEFAULT_RUN
from ...jsonl import read_jsonl, write_jsonl
from ...plots import pyplot, save_figure
from ...rollout.health import SIGNS

PLOT_KEYS = (
    ("reward/mean", "reward (all rollouts)"),
    ("loss", "loss"),
    ("tools/error_ratio_correct_all", "tool-error ratio, correct (all)"),
    ("tools/error_ratio_correct_kept", "tool-error ratio, correct (kept)"),
    ("response/length_mean", "response tokens (mean)"),
    ("response/truncated_share", "share truncated"),
    (tuple(f"health/{s}" for s in SIGNS), "tool-use health (share of rollouts)"),
    (tuple(f"entropy/{c}" for c in CLASSES), "entropy by token class (nats)"),
    (
        ("engine/occupancy", "engine/join_share", "engine/busy_share"),
        "engine: rows held, joins, busy (share)",
    ),
    # asynchronous runs (asynchronous.max_staleness > 0)
    (("staleness/mean", "staleness/max"), "staleness of trained tokens (updates)"),
    (("update/tis_mean", "update/tis_max", "update/tis_truncated"), "importance weight pi_old/mu"),
)


def open_wandb(run_dir: Path, project: str, config: dict[str, Any] | None) -> Any:
    """A Weights & Biases run in ``RUN/wandb/``, offline unless ``WANDB_MODE`` says otherwise (a
    training run should not wait on a network; ``wandb sync RUN/wandb/offline-run-*`` uploads it).
    A resumed run continues the same W&B run (its id is kept in ``RUN/wandb_id``)."""
    try:
        import wandb
    except ImportError:
        raise ImportError("run.wandb needs Weights & Biases: pip install 'rstar2[wandb]'") from None
    id_file = run_dir / "wandb_id"
    run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
    id_file.write_text(run_id)
    return wandb.init(
        project=project,
        dir=str(run_dir),
        id=run_id,
        name=run_dir.name,
        resume="allow",
        mode=os.environ.get("WANDB_MODE", "offline"),
        config=config,
        settings=wandb.Settings(silent=True),
    )


class MetricsLog:
    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = DEFAULT_RUN.tensorboard,
        enabled: bool = True,
        resume_step: int = 0,
        wandb: str | None = DEFAULT_RUN.wandb,
        config: dict[str, Any] | None = None,
    ):
        """``wandb``: a W&B project to log to as well (``config``: the run's settings, shown there)."""
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.writer = self.wandb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            write_jsonl(kept, self.path)  # whole, or not at all: a kill here loses no step
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=resume_step + 1)
        if wandb:
            self.wandb = open_wandb(Path(run_dir), wandb, config)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        scalars = {
            k: v
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
        if self.writer is not None:
            for k, v in scalars.items():
                self.writer.add_scalar(k, v, step)
            self.writer.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def close(self) -> Path | None:
        if not self.enabled:
            return None
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()
        return plot_metrics(self.path)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    return read_jsonl(path, strict=False)  # a line cut by a kill is skipped


def plot_metrics(path: str | Path) -> Path | None:
    """A grid of the main curves over steps (``metrics.png``); a tuple of keys draws a line each."""
    if not Path(path).is_file():
        return None
    rows = read_metrics(path)
    keys = [((k,) if isinstance(k, str) else k, title) for k, title in PLOT_KEYS]
    present = [(ks, title) for ks, title in keys if any(k in r for r in rows for k in ks)]
    if not rows or not present:
        return None
    cols = min(3, len(present))
    nrows = (len(present) + cols - 1) // cols
    fig, axes = pyplot().subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
    for ax, (ks, title) in zip(axes.flat, present, strict=False):
        for k in ks:
            pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
            label = k.split("/")[-1] if len(ks) > 1 else None
            ax.plot(
                [p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 50 else None, label=label
            )
        if len(ks) > 1:
            ax.legend(fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present) :]:
        ax.axis("off")
    return save_figure(fig, Path(path).with_suffix(".png"))

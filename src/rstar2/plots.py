"""Figures written next to the numbers they draw (PNG files): matplotlib on its Agg backend, so no
display is needed, imported only when a figure is drawn (it is slow to import)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path

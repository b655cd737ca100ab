"""What the parts of one recipe run share (``RecipeRun``), and the file that records its progress."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .spec import Recipe

STATE_FILE = "recipe_state.json"


@dataclass
class RecipeRun:
    """What the parts of one run share: its ``services`` (code environment and verifier pool), its
    ``state`` (``recipe_state.json``: what ``--resume`` skips) and ``where`` a failure is reported at."""

    recipe: Recipe
    out: Path
    progress: bool = True
    log: Callable[[str], None] = print
    services: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    where: str = "set-up"

    def save_state(self) -> None:
        tmp = self.out / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=2))
        tmp.replace(self.out / STATE_FILE)

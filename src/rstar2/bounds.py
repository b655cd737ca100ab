"""Bounds of the numeric CLI options that typer's own (``min=``, ``max=``: inclusive) cannot say:
a number that must be above one (a timeout of 0 s means nothing), and the bounds of the config
setting an option sets, read from its pydantic ``Field`` so that they are written once.

tests/test_cli_bounds.py walks every option and reads these bounds back (``Above.low``, ``.high``)."""

from __future__ import annotations

import math
from typing import Any, get_args

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel


class Above:
    """A typer ``parser``: a finite number above ``low`` (and at most ``high``); anything else is a
    usage error that names the option (exit 2)."""

    def __init__(self, low: float, high: float | None = None, kind: type = float) -> None:
        self.low, self.high, self.kind = low, high, kind

    def __call__(self, text: Any) -> Any:
        value = self.kind(text)  # "abc": a ValueError, said as the option's invalid value
        if not (math.isfinite(value) and value > self.low and (self.high is None or value <= self.high)):
            raise ValueError(f"{text} is not in the range {self}")
        return value

    def __str__(self) -> str:
        return f"{self.low:g}<x" + ("" if self.high is None else f"<={self.high:g}")


def above(low: float = 0.0, high: float | None = None, kind: type = float) -> dict[str, Any]:
    """``typer.Option(..., **above(0))``: a float option that must be above ``low``."""
    bound = Above(low, high, kind)
    return {"parser": bound, "metavar": f"{kind.__name__.upper()} [{bound}]"}


def setting(section: type[BaseModel], name: str) -> dict[str, Any]:
    """``typer.Option(..., **setting(RolloutSection, "top_p"))``: the bounds of the option that sets
    ``section.name``, those of its ``Field`` (``min=``/``max=`` where inclusive, else a parser)."""
    field = section.model_fields[name]
    kind = float if float in (field.annotation, *get_args(field.annotation)) else int
    bounds = {type(m): m for m in field.metadata if isinstance(m, Ge | Gt | Le | Lt)}
    if Lt in bounds:
        raise NotImplementedError(f"{section.__name__}.{name}: an open upper bound")
    high = bounds[Le].le if Le in bounds else None
    if Gt in bounds:
        return above(bounds[Gt].gt, high, kind)
    return {"min": bounds[Ge].ge if Ge in bounds else None, "max": high}

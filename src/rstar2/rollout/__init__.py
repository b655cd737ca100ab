"""Multi-turn tool-integrated rollouts over one or more engines (training and evaluation alike)."""

from .multi_turn import Rollout
from .trajectory import Trajectory

__all__ = ["Rollout", "Trajectory"]

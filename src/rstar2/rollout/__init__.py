"""Multi-turn tool-integrated rollouts over one or more engines (training and evaluation alike)."""

from .dispatch import POLICIES, DispatchPolicy, LeastLoaded, Request
from .runner import Rollout, RolloutConfig
from .trajectory import ToolCallRecord, Trajectory, Turn

__all__ = [
    "POLICIES",
    "DispatchPolicy",
    "LeastLoaded",
    "Request",
    "Rollout",
    "RolloutConfig",
    "ToolCallRecord",
    "Trajectory",
    "Turn",
]

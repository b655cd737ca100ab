"""Multi-turn tool-integrated rollouts over one or more engines (training and evaluation alike)."""

from .runner import Rollout, RolloutConfig
from .scheduler import POLICIES, NoEngineError, Request, Scheduler
from .trajectory import ToolCallRecord, Trajectory, Turn

__all__ = [
    "POLICIES",
    "NoEngineError",
    "Request",
    "Rollout",
    "RolloutConfig",
    "Scheduler",
    "ToolCallRecord",
    "Trajectory",
    "Turn",
]

"""Multi-turn tool-integrated rollouts over one or more engines (training and evaluation alike)."""

from .multi_turn import Rollout
from .scheduler import POLICIES, NoEngineError, Request, Scheduler
from .trajectory import ToolCallRecord, Trajectory, Turn

__all__ = [
    "POLICIES",
    "NoEngineError",
    "Request",
    "Rollout",
    "Scheduler",
    "ToolCallRecord",
    "Trajectory",
    "Turn",
]

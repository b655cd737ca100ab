"""rstar2: agentic reinforcement learning for language models that reason with a Python tool."""

from .memory import bound_kernel_caches

__version__ = "0.1.0"

bound_kernel_caches()  # before torch's first kernel (rstar2.memory)

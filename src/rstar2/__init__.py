"""rstar2: agentic reinforcement learning for language models that reason with a Python tool."""

__version__ = "0.1.0"

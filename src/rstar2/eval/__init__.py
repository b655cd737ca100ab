"""Evaluation: benchmark sets and (later) pass@k, maj@k and reports."""

from .datasets import BENCHMARKS, load_benchmark

__all__ = ["BENCHMARKS", "load_benchmark"]

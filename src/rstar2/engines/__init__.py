"""Inference engines behind one protocol: token ids in, token ids and logprobs out."""

from .base import Engine, Generation, SamplingParams

__all__ = ["Engine", "Generation", "SamplingParams"]

"""Inference engines behind one protocol: token ids in, token ids and logprobs out."""

from .base import Engine, Generation, SamplingParams

__all__ = ["Engine", "Generation", "SamplingParams", "load_engine"]


def load_engine(model: str | None = None, server: str | None = None, **kw):
    """``--model PATH`` gives an in-process ``HFEngine``; ``--server URL`` an ``OpenAIEngine``."""
    if (model is None) == (server is None):
        raise ValueError("give exactly one of a model path or a server URL")
    if server is not None:
        from .openai import OpenAIEngine

        return OpenAIEngine(server, model=kw.pop("served_model", None))
    from .hf import HFEngine

    return HFEngine.from_pretrained(model, **kw)

"""What every inference engine offers the rollout: token ids in, token ids and logprobs out."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from ..config import DEFAULT_ROLLOUT

FinishReason = Literal["stop", "length"]


@dataclass
class SamplingParams:
    """Per-request sampling. ``temperature`` 0 is greedy; ``top_k`` 0 and ``top_p`` 1 switch those off."""

    max_new_tokens: int  # the rollout's budget left (rollout.max_response_tokens), always given
    temperature: float = DEFAULT_ROLLOUT.temperature
    top_p: float = DEFAULT_ROLLOUT.top_p
    top_k: int = DEFAULT_ROLLOUT.top_k
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    banned_token_ids: tuple[int, ...] = ()  # never sampled (pad, role tags the model must not write)
    # admission order when rows are short: lower first, then arrival (vLLM's convention)
    priority: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        self.stop_token_ids = tuple(self.stop_token_ids)
        self.banned_token_ids = tuple(self.banned_token_ids)


@dataclass
class Generation:
    """The sampled ids (a stop token included), each one's log-probability under the engine's
    temperature-scaled distribution, and why generation stopped."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    versions: list[int] | None = None  # the policy version that sampled each token, where known


class UnversionedTokens(RuntimeError):
    """An engine sampled tokens without saying which policy version sampled them (a restarted
    server says none until the trainer has loaded its weights): they are never trained on."""


@dataclass(frozen=True)
class WeightUpdate:
    """The trainer's weights as policy ``version``, as the engine takes them: an engine in the
    trainer's process (``Engine.local``) gets ``tensors`` (None: it decodes the trainer's own
    model, which the update wrote in place); a server gets ``folder``, which rank 0 wrote.

    A run that trains every weight sends a model folder (``*.safetensors`` under the names of a
    Hugging Face model, and its ``config.json``) at its start and after each update. A run that
    trains an adapter (``model.lora``) sends, at its start, the base model as a model folder (its
    ``base/``), then the adapter (``adapter_model.safetensors`` and ``adapter_config.json``, PEFT's
    layout: ``rstar2.adapters``) as the same ``version``; after each update only the adapter. An
    engine applies an adapter over the base it holds, or refuses it (a ``ValueError``)."""

    version: int
    tensors: dict[str, Any] | None = None
    folder: Path | None = None


class Engine(Protocol):
    """The contract every engine keeps: what the rollout asks of it (``generate``, its capacity)
    and what the trainer asks (new weights, the version each token was sampled by). A new engine
    is a class keeping it, named in ``engines/kinds.py``'s table or declared by its own package
    (an ``rstar2.engines`` entry point)."""

    name: str
    capacity_tokens: int  # KV-cache tokens the engine can hold at once (capacity-aware scheduling)
    in_flight: int  # requests accepted and not yet answered
    # how it tells which policy version sampled a token: "tokens" (each token's), "stated" (the
    # version it holds, asked before and after a request), None (it cannot: never trained on)
    version_source: str | None
    # in the trainer's process (each process its own, loaded from tensors and checked exactly), or a
    # server (shared by every process, loaded from a folder by rank 0, checked by a sampled probe)
    local: bool
    # whether a prompt's prefix cached for one request serves the next (the kv scheduler then
    # grants turns smaller shares of the capacity: rollout/scheduler.py's grant_budget)
    prefix_cache: bool

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation: ...

    async def load_weights(self, update: WeightUpdate) -> dict[str, Any]:
        """Hold the update's weights as policy ``update.version`` (requests in flight go on under
        them); the answer says what it now holds where it can (``weights_version``,
        ``weights_fingerprint``, ``parameters_written``); weights in a form it does not take (a
        folder for an engine in this process, tensors for a server) are a ``ValueError``."""

    async def counters(self) -> dict[str, Any] | None:
        """Work counted since it started (the trainer's ``engine/*`` metrics); None: it counts none."""

    async def close(self) -> None: ...


class ServedEngine(Engine, Protocol):
    """A server's engine (``local = False``), made as ``Kind(url, capacity_tokens=, timeout_s=,
    reload_path=)`` (and ``weights_url=`` where the run sets one)."""

    @classmethod
    async def serves(cls, url: str) -> bool:
        """Whether the server at ``url`` is one of this kind (asked in ``engines/kinds.py``'s order)."""

    async def probe_capacity(self) -> int:
        """Ask the server what it is (its KV capacity, its versions): called once, before use."""


class LocalEngine(Engine, Protocol):
    """An engine in the trainer's process, decoding a torch model (``HFEngine``), made over a
    loaded model (``Kind(model, name=, max_batch_size=, capacity_tokens=, keep_tokens=, ...)``) or
    ``Kind.from_pretrained(folder, device=, dtype=, ...)``; ``rstar2 serve`` serves one too, and
    writes a server's weight loads into it (``update_weights``, ``update_adapter``)."""

    model: Any  # the torch module it decodes: the trainer's own, or its copy
    threads: int | None  # torch threads of its decoding (None: the process's)
    version: int  # the policy version of the weights it holds (-1: none a trainer sent)
    running: int  # rows in its batch now
    stats: dict[str, Any]  # busy_s (seconds generating) and generated_tokens, since it started

    def paused(self) -> AbstractContextManager[None]:
        """Hold the engine between two decoding steps (to read or write its weights whole)."""

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Write these tensors (a model's, by its own names) as ``version``; a ``ValueError`` when they
        do not fit, before anything is written."""

    def update_adapter(self, folder: str | Path, version: int) -> int:
        """Apply the adapter in ``folder`` over the base held, as ``version``; how many tensors."""

    def invalidate(self, version: int) -> None:
        """Drop what it cached under the old weights (their KV) and hold ``version``."""


def weights_fingerprint(tensors: dict, dtype: str | None = None) -> float:
    """A number that changes with any parameter: per tensor (in key order) the float64 sum and sum
    of squares, weighted by position. Both sides of a weight update compute it the same way, in
    the engine's ``dtype`` (values rounded to it first), so equal weights give equal numbers."""
    import torch

    cast = getattr(torch, dtype) if dtype else None
    total = 0.0
    for i, key in enumerate(sorted(tensors)):
        t = tensors[key].detach()
        if cast is not None and t.is_floating_point():
            t = t.to(cast)
        t = t.to(device="cpu", dtype=torch.float64)
        total += (i + 1) * (float(t.sum()) + 1e-3 * float(t.square().sum()))
    return total

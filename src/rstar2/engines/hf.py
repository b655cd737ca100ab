"""``HFEngine``: a transformers model served to concurrent async callers, CPU or CUDA.

Requests that arrive while a batch runs wait and form the next batch together. A batch is
left-padded, prefilled once and decoded with a KV cache; rows that finish leave the batch at once
(their cache rows are dropped), so one long generation does not make the short ones pay.
The model runs in one thread of its own; the event loop stays free for tool calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .base import Generation, SamplingParams
from .sampling import next_tokens


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def compute_precision(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA, full precision elsewhere: the trainer's forward passes and the
    in-process engine (which shares the trainer's fp32 parameters) both compute in bf16 on a GPU,
    as an inference server would, without a second copy of the weights."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def max_positions(model: Any) -> int:
    return int(getattr(model.config, "max_position_embeddings", 1 << 30))


@torch.no_grad()
def generate_batch(
    model: Any, prompts: list[list[int]], params: list[SamplingParams], pad_id: int = 0
) -> list[Generation]:
    """Generate for several prompts at once (left padding, KV cache, finished rows compacted away)."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    limit = max_positions(model)
    n = len(prompts)
    out_ids: list[list[int]] = [[] for _ in range(n)]
    out_lp: list[list[float]] = [[] for _ in range(n)]
    finish: list[str] = ["length"] * n
    budgets = [min(p.max_new_tokens, limit - len(ids)) for p, ids in zip(params, prompts, strict=True)]
    for i, b in enumerate(budgets):
        if b <= 0:
            raise ValueError(
                f"prompt of {len(prompts[i])} tokens leaves no room in the model's {limit} positions"
            )
    gens = [random.Random(p.seed) if p.seed is not None else None for p in params]
    width = max(len(p) for p in prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((n, width), dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    active = list(range(n))  # original row of each batch row
    logits = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, logits_to_keep=1
    ).logits[:, -1]
    last_pos = positions[:, -1]
    while active:
        tokens, logps = next_tokens(logits, [params[i] for i in active], [gens[i] for i in active])
        keep: list[int] = []
        # one device→host copy per step, not two per row
        for row, (orig, tok, lp) in enumerate(zip(active, tokens.tolist(), logps.tolist(), strict=True)):
            out_ids[orig].append(tok)
            out_lp[orig].append(lp)
            if tok in params[orig].stop_token_ids:
                finish[orig] = "stop"
            elif len(out_ids[orig]) < budgets[orig]:
                keep.append(row)
        if not keep:
            break
        if len(keep) < len(active):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask, last_pos, tokens = mask[index], last_pos[index], tokens[index]
            active = [active[r] for r in keep]
        mask = torch.cat([mask, torch.ones((len(active), 1), dtype=mask.dtype, device=device)], dim=1)
        last_pos = last_pos + 1
        logits = model(
            input_ids=tokens.unsqueeze(1),
            attention_mask=mask,
            position_ids=last_pos.unsqueeze(1),
            past_key_values=cache,
        ).logits[:, -1]
    return [
        Generation(out_ids[i], out_lp[i], finish[i])  # type: ignore[arg-type]
        for i in range(n)
    ]


class HFEngine:
    """A transformers causal LM behind the ``Engine`` protocol."""

    def __init__(
        self,
        model: Any,
        *,
        name: str = "hf",
        max_batch_size: int = 64,
        capacity_tokens: int | None = None,
        pad_token_id: int | None = None,
        gather_s: float = 0.01,
    ) -> None:
        self.model = model.eval()
        self.gather_s = gather_s
        self.name = name
        self.max_batch_size = max_batch_size
        self.capacity_tokens = capacity_tokens or max_batch_size * min(max_positions(model), 4096)
        self.prefix_cache = False  # a request prefills its whole prompt (see Rollout's grants)
        self.pad_token_id = pad_token_id if pad_token_id is not None else (model.config.pad_token_id or 0)
        self.lock = threading.Lock()  # held while a batch runs; hold it to change the weights
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self.in_flight = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self.stats = {"batches": 0, "requests": 0, "generated_tokens": 0, "busy_s": 0.0}

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, device: str = "auto", dtype: str = "auto", **kw: Any
    ) -> HFEngine:
        from transformers import AutoModelForCausalLM

        dev = pick_device(device)
        if dtype == "auto":
            torch_dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        else:
            torch_dtype = getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype).to(dev)
        return cls(model, name=kw.pop("name", Path(path).name), **kw)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if self._closed:
            raise RuntimeError(f"engine {self.name} is closed")
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) >= max_positions(self.model):
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens leaves no room in the model's "
                f"{max_positions(self.model)} positions"
            )
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=f"engine-{self.name}", daemon=True)
            self._thread.start()
        loop = asyncio.get_running_loop()
        req = _Request(list(prompt_ids), params, loop, loop.create_future())
        self.in_flight += 1
        try:
            self._queue.put(req)
            return await req.future
        finally:
            self.in_flight -= 1

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """New policy weights (not needed when the engine shares the trainer's model object)."""
        with self.lock:
            self.model.load_state_dict(state_dict, strict=False)

    async def close(self) -> None:
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            await asyncio.to_thread(self._thread.join, 30)

    # -- the engine's own thread -------------------------------------------------------------
    def _take_batch(self) -> list[_Request] | None:
        first = self._queue.get()
        if first is None:
            return None
        batch = [first]
        # Requests of a burst (a rollout batch starting, tool calls returning together) arrive a
        # little apart: wait until the queue has been quiet for ``gather_s`` (at most 10 windows),
        # so the first request does not run alone while the rest of the burst queues behind it.
        deadline = time.perf_counter() + 10 * self.gather_s
        while len(batch) < self.max_batch_size:
            wait = min(self.gather_s, deadline - time.perf_counter())
            try:
                nxt = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                self._queue.put(None)
                break
            batch.append(nxt)
        return batch

    def _serve(self) -> None:
        while (batch := self._take_batch()) is not None:
            start = time.perf_counter()
            try:
                with self.lock, compute_precision(next(self.model.parameters()).device):
                    results: list[Any] = generate_batch(
                        self.model,
                        [r.prompt_ids for r in batch],
                        [r.params for r in batch],
                        self.pad_token_id,
                    )
            except Exception as exc:  # one bad batch fails its own requests, the engine goes on
                results = [exc] * len(batch)
            self.stats["batches"] += 1
            self.stats["requests"] += len(batch)
            self.stats["busy_s"] += time.perf_counter() - start
            for req, res in zip(batch, results, strict=True):
                if isinstance(res, Generation):
                    self.stats["generated_tokens"] += len(res.token_ids)
                req.loop.call_soon_threadsafe(_settle, req.future, res)


def _settle(fut: asyncio.Future, result: Any) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)

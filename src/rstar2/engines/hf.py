"""``HFEngine``: a transformers model served to concurrent async callers, CPU or CUDA, with
continuous batching and each trajectory's KV kept across its tool turns.

One thread of its own runs the model step by step. A request that arrives while others decode
joins the running batch at the next step: its prompt is prefilled (identical prompts, a group's
2G rollouts, once) and it decodes with the rest; a row that finishes leaves at once. When a
request ends, its sequence's keys and values are kept (``engines/kv.py``: a token budget, least
recently used out) so that the trajectory's next turn, whose prompt extends them by the tool's
response, prefills only the new tokens. Kept and running caches are tied to the weights they were
computed under: parameters changed in place (an optimizer step on the shared model, a
``load_state_dict``) drop every kept prefix and re-prefill the running rows.

transformers' own continuous-batching manager (``generate_batch``/``init_continuous_batching``)
was measured first (benchmarks/RESULTS.md, issue 15) and not used: on CPU it ran at 0.28× this
engine, kept prefixes computed under old weights after an update, failed every request in flight
on one bad request, and has no per-request seed, banned ids or finish reason.
"""

from __future__ import annotations

import asyncio
import queue
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..device import compute_precision, decode_compute, max_positions, pick_device
from .base import Generation, SamplingParams
from .kv import BatchKV, PrefixStore, SeqKV, common_prefix
from .sampling import next_tokens


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    arrived: float = 0.0


@dataclass
class _Row:
    """A request in the running batch: what it generated so far; its cache holds the prompt and
    every generated id but the last (the last is fed at the next decode step)."""

    req: _Request
    budget: int
    rng: random.Random | None
    out_ids: list[int] = field(default_factory=list)
    out_lp: list[float] = field(default_factory=list)
    finish: str = "length"

    def context(self) -> list[int]:
        return self.req.prompt_ids + self.out_ids


def weights_version(model: Any) -> int:
    """Changes whenever a parameter is written in place (optimizer step, ``load_state_dict``) or
    replaced: torch counts in-place writes per tensor."""
    return hash(tuple((p.data_ptr(), p._version) for p in model.parameters()))


class HFEngine:
    """A transformers causal LM behind the ``Engine`` protocol (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        *,
        name: str = "hf",
        max_batch_size: int = 64,
        capacity_tokens: int | None = None,
        keep_tokens: int | None = None,
        pad_token_id: int | None = None,
        gather_s: float = 0.01,
        compute: str = "auto",
    ) -> None:
        self.model = model.eval()
        attention = getattr(model.config, "_attn_implementation", None) or "sdpa"
        if attention not in ("sdpa", "eager"):
            raise ValueError(
                f"HFEngine batches rows of different lengths under its own attention mask, which "
                f"'{attention}' attention does not take; load the model with attn_implementation='sdpa'"
            )
        self._additive_mask = attention == "eager"  # eager attention adds the mask to the scores
        self.gather_s = gather_s
        self.compute = compute  # the trainer's model.compute; decode_compute() picks the engine's
        self.name = name
        self.max_batch_size = max_batch_size
        total = capacity_tokens or max_batch_size * min(max_positions(model), 4096)
        # the kept prefixes' budget comes out of the capacity the scheduler may grant
        self.keep_tokens = total // 4 if keep_tokens is None else keep_tokens
        self.capacity_tokens = max(1, total - self.keep_tokens)
        self.prefix_cache = self.keep_tokens > 0
        self.store = PrefixStore(self.keep_tokens)
        self.pad_token_id = pad_token_id if pad_token_id is not None else (model.config.pad_token_id or 0)
        self.lock = threading.Lock()  # held during a step; hold it to change the weights
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._pending: deque[_Request] = deque()
        self.in_flight = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._version: int | None = None
        self.stats = {
            "batches": 0,  # admissions: groups of requests that joined together
            "requests": 0,
            "generated_tokens": 0,
            "busy_s": 0.0,
            "steps": 0,  # decode steps
            "row_steps": 0,  # rows decoded, summed over steps (occupancy = row_steps / steps)
            "prefill_tokens": 0,  # tokens prefilled
            "reused_tokens": 0,  # prompt tokens not prefilled: a kept prefix of the same trajectory
            "shared_tokens": 0,  # prompt tokens not prefilled: an identical prompt in the same admission
            "queue_wait_s": 0.0,  # summed over requests: arrival to admission
            "reprefills": 0,  # running rows prefilled again after new weights
            "prefill_s": 0.0,  # of busy_s: admissions (prefill, joining the batch)
        }

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
        vocab = self.model.get_input_embeddings().num_embeddings
        if not all(0 <= t < vocab for t in prompt_ids):
            bad = next(t for t in prompt_ids if not 0 <= t < vocab)
            raise ValueError(f"token id {bad} is outside the vocabulary (0..{vocab - 1})")
        if len(prompt_ids) >= max_positions(self.model):
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens leaves no room in the model's "
                f"{max_positions(self.model)} positions"
            )
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=f"engine-{self.name}", daemon=True)
            self._thread.start()
        loop = asyncio.get_running_loop()
        req = _Request(list(prompt_ids), params, loop, loop.create_future(), time.perf_counter())
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
        """Stop the engine's thread and drop the kept prefixes (up to ``keep_tokens`` of KV: a
        closed engine that something still references must not hold them)."""
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            await asyncio.to_thread(self._thread.join, 30)
        with self.lock:
            self.store.clear()

    # -- the engine's own thread -------------------------------------------------------------
    def _admit(self, free: int, wait: bool) -> list[_Request] | None:
        """Requests to join now (at most ``free``). With nothing running (``wait``), block for the
        first and gather the rest of its burst; else take what has arrived. None: closing."""
        if wait and not self._pending:
            first = self._queue.get()
            if first is None:
                return None
            self._pending.append(first)
        # a burst (a rollout batch starting, tool calls returning together) arrives a little apart:
        # with nothing running, wait until the queue has been quiet for ``gather_s`` (at most 10
        # windows); with rows running, take only what is there
        deadline = time.perf_counter() + 10 * self.gather_s
        while True:
            left = (
                min(self.gather_s, deadline - time.perf_counter())
                if wait and len(self._pending) < free
                else 0
            )
            try:
                nxt = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                self._queue.put(None)  # seen again once the running rows are done
                break
            self._pending.append(nxt)
        taken = [self._pending.popleft() for _ in range(min(free, len(self._pending)))]
        now = time.perf_counter()
        self.stats["queue_wait_s"] += sum(now - r.arrived for r in taken)
        return taken

    def _serve(self) -> None:
        device = next(self.model.parameters()).device
        compute = decode_compute(device, self.compute)
        batch = _Batch(device, self.max_batch_size)
        while True:
            new = self._admit(self.max_batch_size - len(batch.rows), wait=not batch.rows)
            if new is None and not batch.rows:
                break
            start = time.perf_counter()
            with torch.no_grad(), self.lock, compute_precision(device, compute):
                version = weights_version(self.model)
                if version != self._version:  # new weights: nothing computed under the old ones is used
                    self.store.clear()
                    self._version = version
                    if batch.rows:
                        self.stats["reprefills"] += len(batch.rows)
                        self._guard(batch, batch.rows, lambda: batch.refill(self))
                if new:
                    t0 = time.perf_counter()
                    rows = [self._row(r) for r in new]
                    if not self._guard(
                        batch, rows, lambda rows=rows: batch.join(self, rows), fail=len(rows) == 1
                    ):
                        for row in rows:  # one of them is bad: each joins alone, the bad one fails alone
                            self._guard(batch, [row], lambda row=row: batch.join(self, [row]))
                    self.stats["prefill_s"] += time.perf_counter() - t0
                if batch.rows:
                    self._guard(batch, list(batch.rows), lambda: batch.step(self))
            self.stats["busy_s"] += time.perf_counter() - start

    def _guard(self, batch: _Batch, rows: list[_Row], action: Any, fail: bool = True) -> bool:
        """Run a step; if it fails, its rows fail with the error (the whole running batch when the
        failure may have left it half-changed; ``fail=False``: new rows are left to retry) and
        the engine goes on serving. True when the step ran."""
        try:
            action()
            return True
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the engine
            running = {id(r) for r in batch.rows}
            touched = any(id(r) in running for r in rows)
            if touched or batch.kv.rows != len(batch.rows):
                failed = list(batch.rows) + [r for r in rows if id(r) not in running]
                batch.reset()
            elif fail:
                failed = list(rows)
            else:
                return False
            for row in failed:
                row.req.loop.call_soon_threadsafe(_settle, row.req.future, exc)
            return False

    def _row(self, req: _Request) -> _Row:
        budget = min(req.params.max_new_tokens, max_positions(self.model) - len(req.prompt_ids))
        seed = req.params.seed
        self.stats["requests"] += 1
        return _Row(req, budget, random.Random(seed) if seed is not None else None)

    def _forward(self, ids: torch.Tensor, kv: BatchKV, span: tuple[int, int], new: list[int]) -> torch.Tensor:
        """One pass over ``ids`` (rows ``span`` of ``kv``; row r's ``new[r]`` tokens right-aligned)
        appended to those rows' caches; the logits of each row's last token."""
        positions, mask = kv.plan(span, new, ids.shape[1])
        if self._additive_mask:
            mask = torch.zeros(mask.shape, dtype=self.model.dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(self.model.dtype).min
            )
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, cache=kv.cache, logits_to_keep=1
        )
        kv.commit(span, new)
        return out.logits[:, -1]


MIN_SHARED_PREFIX = 16  # tokens a group's prompts must share before the prefix is prefilled once


class _Batch:
    """The running rows (in the order of their cache's rows), their cache, and the logits of each
    row's next token."""

    def __init__(self, device: torch.device, max_rows: int | None = None) -> None:
        self.device, self.max_rows = device, max_rows
        self.reset()

    def reset(self) -> None:
        self.rows: list[_Row] = []
        self.kv = BatchKV(self.device, self.max_rows)
        self.logits: torch.Tensor | None = None

    def _prefill(
        self, engine: HFEngine, kv: BatchKV, contexts: list[list[int]], kept: list[SeqKV | None]
    ) -> tuple[list[int], torch.Tensor]:
        """Rows for ``contexts`` added to ``kv``, holding their kept prefixes, and the rest of each
        prefilled; identical contexts (after no prefix or a shared one) prefilled once. Returns
        the order the rows were added in (indexes into ``contexts``) and their next-token logits."""
        unique: dict[Any, int] = {}
        index = []
        for i, (ctx, seq) in enumerate(zip(contexts, kept, strict=True)):
            key = tuple(ctx) if seq is None or seq.shared else i
            index.append(unique.setdefault(key, len(unique)))
        firsts = [index.index(u) for u in range(len(unique))]  # the first row of each distinct context
        start = kv.rows
        kv.add([kept[i] for i in firsts])
        news = [contexts[i][kept[i].length if kept[i] is not None else 0 :] for i in firsts]
        width = max(len(n) for n in news)
        ids = torch.full((len(news), width), engine.pad_token_id, dtype=torch.long)
        for r, n in enumerate(news):
            ids[r, width - len(n) :] = torch.tensor(n, dtype=torch.long)
        span = (start, start + len(firsts))
        logits = engine._forward(ids.to(self.device), kv, span, [len(n) for n in news])
        engine.stats["prefill_tokens"] += sum(len(n) for n in news)
        engine.stats["shared_tokens"] += sum(  # identical contexts prefilled once
            len(contexts[i]) - (kept[i].length if kept[i] is not None else 0) for i in range(len(contexts))
        ) - sum(len(n) for n in news)
        copies = [i for i in range(len(contexts)) if firsts[index[i]] != i]
        for i in copies:
            kv.copy_row(start + index[i])
        if copies:
            logits = torch.cat([logits, logits[torch.tensor([index[i] for i in copies], device=self.device)]])
        return firsts + copies, logits

    def join(self, engine: HFEngine, rows: list[_Row]) -> None:
        """New rows join the batch: a kept prefix of the same trajectory taken from the store; a
        prefix the others share (the system prompt, a group's problem) prefilled once; the rest
        prefilled together. The running rows' caches are not touched (a failed join is undone)."""
        prompts = [r.req.prompt_ids for r in rows]
        store = engine.store if engine.prefix_cache else None
        kept = [store.take(p, engine._version) if store is not None else None for p in prompts]
        fresh = [i for i, seq in enumerate(kept) if seq is None or seq.shared]
        # (one token short of the shortest prompt: each row prefills at least its last token)
        shared = (
            min(common_prefix([prompts[i] for i in fresh]), min(len(prompts[i]) for i in fresh) - 1)
            if len(fresh) > 1
            else 0
        )
        longest_kept = max((kept[i].length for i in fresh if kept[i] is not None), default=0)
        if shared >= max(MIN_SHARED_PREFIX, longest_kept + 1) and all(
            len(prompts[i]) > shared for i in fresh
        ):
            ids = prompts[fresh[0]][:shared]
            alone = BatchKV(self.device)
            self._prefill(engine, alone, [ids], [kept[fresh[0]]])
            prefix = alone.sequence(0, tuple(ids), engine._version, shared=True)
            if store is not None:
                store.put(prefix)
            for i in fresh:
                kept[i] = prefix
        for seq in kept:
            if seq is not None:
                engine.stats["shared_tokens" if seq.shared else "reused_tokens"] += seq.length
        running = self.kv.rows
        try:
            order, logits = self._prefill(engine, self.kv, prompts, kept)
        except BaseException:
            self.kv.truncate(running)
            raise
        engine.stats["batches"] += 1
        self.rows += [rows[i] for i in order]
        self.logits = logits if self.logits is None else torch.cat([self.logits, logits])

    def refill(self, engine: HFEngine) -> None:
        """Every running row prefilled again from its tokens (the weights changed under it)."""
        rows = self.rows
        self.kv = BatchKV(self.device, self.max_rows)
        order, self.logits = self._prefill(engine, self.kv, [r.context() for r in rows], [None] * len(rows))
        self.rows = [rows[i] for i in order]

    def step(self, engine: HFEngine) -> None:
        """Sample each row's next token; rows that end leave (their cache kept); the rest decode."""
        rows = self.rows
        tokens, logps = next_tokens(self.logits, [r.req.params for r in rows], [r.rng for r in rows])
        ids = tokens.tolist()
        done: list[int] = []
        for i, (row, tok, lp) in enumerate(zip(rows, ids, logps.tolist(), strict=True)):
            row.out_ids.append(tok)
            row.out_lp.append(lp)
            if tok in row.req.params.stop_token_ids:
                row.finish = "stop"
            elif len(row.out_ids) < row.budget:
                continue
            self._finish(engine, i, row)
            done.append(i)
        engine.stats["steps"] += 1
        engine.stats["row_steps"] += len(rows)
        if len(done) == len(rows):
            self.reset()
            return
        for i in reversed(done):  # the last row moves into each finished row's slot
            self.kv.remove(i)
            rows[i], ids[i] = rows[-1], ids[-1]
            rows.pop()
            ids.pop()
        n = len(rows)
        column = torch.tensor(ids, dtype=torch.long).unsqueeze(1).to(self.device)
        self.logits = engine._forward(column, self.kv, (0, n), [1] * n)

    def _finish(self, engine: HFEngine, i: int, row: _Row) -> None:
        if engine.prefix_cache:
            ids = tuple(row.req.prompt_ids + row.out_ids[:-1])
            engine.store.put(self.kv.sequence(i, ids, engine._version))
        engine.stats["generated_tokens"] += len(row.out_ids)
        gen = Generation(row.out_ids, row.out_lp, row.finish)  # type: ignore[arg-type]
        row.req.loop.call_soon_threadsafe(_settle, row.req.future, gen)


def _settle(fut: asyncio.Future, result: Any) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)

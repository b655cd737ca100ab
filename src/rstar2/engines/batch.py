"""The running batch of ``HFEngine``: its rows, their slots in the cache, and the kept prefixes.
Rows live in the cache's ``owners`` (``kv.py``), so a row and its slot move together."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .base import Generation, SamplingParams
from .graphs import StaticDecode
from .kv import PrefixStore, SeqKV, SlotCache, last_logits
from .sampling import next_tokens

MIN_SHARED_PREFIX = 16  # tokens a group's prompts must share before the prefix is prefilled once


@dataclass
class Request:
    """A caller's request, answered from the engine's thread through ``settle``."""

    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    arrived: float = 0.0
    # a streaming caller's: each sampled token and its log-prob, on ``loop`` (before ``settle``'s answer)
    on_token: Callable[[int, float], None] | None = None

    @property
    def abandoned(self) -> bool:
        """Its caller stopped waiting (cancelled: its client went away, streamed or not): nobody reads it."""
        return self.future.cancelled()

    def settle(self, result: Generation | BaseException) -> None:
        self.loop.call_soon_threadsafe(_settle, self.future, result)


def _settle(fut: asyncio.Future, result: Any) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)


@dataclass
class Row:
    """A request in the running batch: what it generated so far; its slot holds the prompt and
    every generated id but the last (the last is fed at the next decode step)."""

    req: Request
    budget: int
    rng: random.Random | None
    out_ids: list[int] = field(default_factory=list)
    out_lp: list[float] = field(default_factory=list)
    out_ver: list[int] = field(default_factory=list)  # the weights' version that sampled each id
    next_version: int = 0  # the version of the weights its next-token logits came from
    finish: str = "length"


class RunningBatch:
    """The rows being decoded, their cache, and the logits of each row's next token."""

    def __init__(
        self,
        model: Any,
        device: torch.device,
        max_rows: int,
        pad_token_id: int,
        store: PrefixStore | None,
        stats: dict[str, Any],
        cuda_graphs: bool = False,
    ) -> None:
        self.model, self.device, self.max_rows = model, device, max_rows
        self.pad_token_id, self.store, self.stats = pad_token_id, store, stats
        # the decode step CUDA graphs replay (graphs.py), captured on a GPU; None: the eager step
        self.static_decode = (
            StaticDecode(model, device, max_rows, capture=device.type == "cuda") if cuda_graphs else None
        )
        self.version = 0  # the policy version of the weights the next forward uses (set by the engine)
        self.reset()

    @property
    def rows(self) -> list[Row]:
        """The running rows, in the order of their slots."""
        return self.kv.owners

    def reset(self) -> None:
        if self.static_decode is not None and hasattr(self, "kv"):
            self.kv.clear()  # the captured graphs read these buffers: keep them
        else:
            self.kv = SlotCache(self.device, self.max_rows)
        self.logits: torch.Tensor | None = None

    def guarded(self, rows: list[Row], action: Callable[[], None], fail: bool = True) -> bool:
        """Run ``action``; if it fails, its rows fail with the error (the whole batch when the
        failure may have left it half-changed; ``fail=False``: new rows are left to retry) and the
        batch is ready for the next step. True when the action ran."""
        try:
            action()
            return True
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the engine
            running = {id(r) for r in self.rows}
            if any(id(r) in running for r in rows):
                failed = list(self.rows) + [r for r in rows if id(r) not in running]
                self.reset()
            elif fail:
                failed = list(rows)
            else:
                return False
            for row in failed:
                row.req.settle(exc)
            return False

    def forward(
        self, ids: torch.Tensor, kv: SlotCache, span: tuple[int, int], new: list[int]
    ) -> torch.Tensor:
        """One pass over ``ids`` (rows ``span`` of ``kv``; row r's ``new[r]`` tokens right-aligned)
        appended to those rows' caches; the logits of each row's last token."""
        positions, mask = kv.plan(span, new, ids.shape[1])
        logits = last_logits(self.model, ids, positions, mask, kv)
        kv.commit(span, new)
        return logits

    def _prefill(
        self, kv: SlotCache, contexts: list[list[int]], kept: list[SeqKV | None], owners: list[Any]
    ) -> torch.Tensor:
        """Rows for ``contexts`` (occupied by ``owners``) added to ``kv``, holding their kept
        prefixes, and the rest of each prefilled; identical contexts (after no prefix or a shared
        one) prefilled once and copied. Returns the new rows' next-token logits, in slot order."""
        unique: dict[Any, int] = {}
        index = []
        for i, (ctx, seq) in enumerate(zip(contexts, kept, strict=True)):
            key = tuple(ctx) if seq is None or seq.shared else i
            index.append(unique.setdefault(key, len(unique)))
        firsts = [index.index(u) for u in range(len(unique))]  # the first row of each distinct context
        start = kv.rows
        kv.add([kept[i] for i in firsts], [owners[i] for i in firsts])
        skip = [seq.length if seq is not None else 0 for seq in kept]
        news = [contexts[i][skip[i] :] for i in firsts]
        width = max(len(n) for n in news)
        ids = torch.tensor([[self.pad_token_id] * (width - len(n)) + n for n in news], dtype=torch.long)
        span = (start, start + len(firsts))
        logits = self.forward(ids.to(self.device), kv, span, [len(n) for n in news])
        prefilled = sum(len(n) for n in news)
        self.stats["prefill_tokens"] += prefilled
        self.stats["shared_tokens"] += sum(len(c) for c in contexts) - sum(skip) - prefilled
        copies = [i for i in range(len(contexts)) if firsts[index[i]] != i]
        for i in copies:
            kv.copy_row(start + index[i], owners[i])
        if copies:
            logits = torch.cat([logits, logits[torch.tensor([index[i] for i in copies], device=self.device)]])
        return logits

    def join(self, rows: list[Row]) -> None:
        """New rows join the batch: a kept prefix of the same trajectory taken from the store; a
        prefix the others share (the system prompt, a group's problem) prefilled once; the rest
        prefilled together. The running rows' caches are not touched (a failed join is undone)."""
        prompts = [r.req.prompt_ids for r in rows]
        kept = [self.store.take(p) if self.store is not None else None for p in prompts]
        fresh = [i for i, seq in enumerate(kept) if seq is None or seq.shared]
        common = 0
        if len(fresh) > 1:  # one token short of the shortest: each row prefills at least its last
            shortest = min(len(prompts[i]) for i in fresh)
            common = min(len(os.path.commonprefix([prompts[i] for i in fresh])), shortest - 1)
        longest_kept = max((kept[i].length for i in fresh if kept[i] is not None), default=0)
        if common >= max(MIN_SHARED_PREFIX, longest_kept + 1):
            ids = prompts[fresh[0]][:common]
            alone = SlotCache(self.device)
            self._prefill(alone, [ids], [kept[fresh[0]]], [None])
            prefix = alone.sequence(0, tuple(ids), shared=True)
            if self.store is not None:
                self.store.put(prefix)
            for i in fresh:
                kept[i] = prefix
        for seq in kept:
            if seq is not None:
                self.stats["shared_tokens" if seq.shared else "reused_tokens"] += seq.length
        running = self.kv.rows
        try:
            logits = self._prefill(self.kv, prompts, kept, rows)
        except BaseException:
            self.kv.truncate(running)
            raise
        self.stats["batches"] += 1
        self.logits = logits if self.logits is None else torch.cat([self.logits, logits])
        for row in rows:
            row.next_version = self.version

    def refill(self) -> None:
        """Every running row prefilled again from its tokens (the weights changed under it)."""
        rows = list(self.rows)
        contexts = [r.req.prompt_ids + r.out_ids for r in rows]
        self.reset()
        self.logits = self._prefill(self.kv, contexts, [None] * len(rows), rows)  # failed: ``guarded`` resets
        for row in rows:
            row.next_version = self.version

    def step(self) -> None:
        """Sample each row's next token; rows that end leave (their cache kept); the rest decode."""
        rows = self.rows
        tokens, logps = next_tokens(self.logits, [r.req.params for r in rows], [r.rng for r in rows])
        ids = tokens.tolist()
        done: list[int] = []
        for i, (row, tok, lp) in enumerate(zip(rows, ids, logps.tolist(), strict=True)):
            if row.req.abandoned:  # it leaves now, its cache not kept
                self.stats["abandoned"] += 1
                done.append(i)
                continue
            row.out_ids.append(tok)
            row.out_lp.append(lp)
            row.out_ver.append(row.next_version)
            if row.req.on_token is not None:
                row.req.loop.call_soon_threadsafe(row.req.on_token, tok, lp)
            if tok in row.req.params.stop_token_ids:
                row.finish = "stop"
            elif len(row.out_ids) < row.budget:
                continue
            self._finish(i, row)
            done.append(i)
        self.stats["steps"] += 1
        self.stats["row_steps"] += len(rows)
        if len(done) == len(rows):
            self.reset()
            return
        for i in reversed(done):  # the last row (and its slot) moves into each finished row's place
            self.kv.remove(i)
            ids[i] = ids[-1]
            ids.pop()
        static = self.static_decode if self.static_decode and self.static_decode.broken is None else None
        self.logits = static.decode(self.kv, ids, self.pad_token_id) if static else None
        if self.logits is None:
            n = len(ids)
            column = torch.tensor(ids, dtype=torch.long).unsqueeze(1).to(self.device)
            self.logits = self.forward(column, self.kv, (0, n), [1] * n)
        for row in self.rows:
            row.next_version = self.version

    def _finish(self, i: int, row: Row) -> None:
        if self.store is not None:
            self.store.put(self.kv.sequence(i, tuple(row.req.prompt_ids + row.out_ids[:-1])))
        self.stats["generated_tokens"] += len(row.out_ids)
        row.req.settle(Generation(row.out_ids, row.out_lp, row.finish, row.out_ver))  # type: ignore[arg-type]

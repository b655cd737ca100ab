"""The decode step replayed as CUDA graphs: what makes a small model's decode fast on a GPU.

On a GPU a decode step of a 135M model is kernel launches and Python, not arithmetic: SmolLM2's
took ~75 ms at any batch size on an H200 (benchmarks/RESULTS.md), 7-11 ms replayed. A CUDA graph
records the step's kernels once and replays them with one launch. A graph fixes its shapes and
addresses, so the step runs in a static form:

- **rows** padded up to a bucket (1, 2, 4, 8, then multiples of 8 up to the engine's rows, as
  vLLM does); a padding row writes to its slot's scratch column and attends to column 0 only, and
  its logits are dropped; a graph per bucket, captured the first time a step needs it;
- **columns**: attention reads every column of the cache's buffers (the mask hides what a row does
  not hold), so the graph does not depend on the longest row; the buffers are kept when the batch
  empties, and a graph is captured again only when they grow (by half, so rarely);
- **inputs**: the step's ids, positions and write columns are copied into static buffers; the mask
  is computed inside the graph from the positions.

The weights are read where they live, so an optimizer step or ``load_state_dict`` (both in place)
reaches the next replay; grown buffers, or parameters replaced by new tensors (looked at only when
the engine sees new weights: ``weights_changed``), drop every graph.
Capture runs with autocast's weight-cast cache off, so a cast is part of the graph, not a tensor
cast once under old weights.

``capture=False`` runs the same static step eagerly: the path the CPU tests compare with the
dynamic decode (same tokens), and what a CPU engine would run if asked for it.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .kv import SlotCache, model_mask


def buckets(max_rows: int) -> list[int]:
    """Row counts a graph is captured for: 1, 2, 4, 8, then every 8 up to ``max_rows`` (and it)."""
    sizes = [b for b in (1, 2, 4) if b < max_rows] + list(range(8, max_rows, 8)) + [max_rows]
    return sorted(set(sizes))


class DecodeGraphs:
    """The static decode step of one engine (see the module docstring)."""

    def __init__(self, model: Any, device: torch.device, max_rows: int, capture: bool) -> None:
        self.model, self.device, self.max_rows = model, device, max_rows
        self.capture = capture
        self.sizes = buckets(max_rows)
        # (3, max_rows): ids, positions, write columns of the step (padding rows: pad, 0, scratch)
        self.inputs = torch.zeros((3, max_rows), dtype=torch.long, device=device)
        self.rows_index = torch.arange(max_rows, device=device)
        self.graphs: dict[int, tuple[Any, torch.Tensor]] = {}  # bucket → (graph, its logits)
        self._key: tuple[int, ...] | None = None  # the buffers the graphs were taken on
        self._weights = self._pointers()  # where the parameters the graphs read live
        self.captures = 0  # graphs captured (a counter for tests and the benchmark)
        self.broken: str | None = None  # why a capture failed: the engine then decodes eagerly

    def bucket(self, rows: int) -> int:
        return next(b for b in self.sizes if b >= rows)

    def decode(self, kv: SlotCache, ids: list[int], pad_token_id: int) -> torch.Tensor | None:
        """One decode step of the batch's ``len(ids)`` rows (row r feeds ``ids[r]``) through the
        static step of their bucket; returns each row's next-token logits (rows, vocab), or None
        when its graph could not be captured (nothing committed: the caller decodes eagerly)."""
        n = len(ids)
        b = self.bucket(n)
        kv.reserve(self.max_rows, max(kv.lens[:n]) + 1)
        key = self._buffers_key(kv)
        if key != self._key:  # buffers grown: the old graphs point elsewhere
            self.graphs.clear()
            self._key = key
        scratch = kv.cols_cap - 1
        host = torch.tensor(
            [
                ids + [pad_token_id] * (b - n),
                kv.lens[:n] + [0] * (b - n),
                kv.lens[:n] + [scratch] * (b - n),
            ],
            dtype=torch.long,
        )
        self.inputs[:, :b].copy_(host, non_blocking=True)
        if not self.capture:
            logits = self._step(kv, b)
        else:
            if b not in self.graphs:
                try:
                    self.graphs[b] = self._capture(kv, b)
                except RuntimeError as exc:  # an op the graph cannot record: decode eagerly from now on
                    self.broken = f"{type(exc).__name__}: {exc}"
                    warnings.warn(
                        f"CUDA graph capture failed, decoding without graphs: {self.broken}", stacklevel=2
                    )
                    return None
            graph, out = self.graphs[b]
            graph.replay()
            logits = out
        kv.commit((0, n), [1] * n)
        return logits[:n].clone() if self.capture else logits[:n]

    def weights_changed(self) -> None:
        """The engine saw new weights: written in place the graphs read them as they are; replaced
        by new tensors, every graph is dropped (captured again when next needed)."""
        pointers = self._pointers()
        if pointers != self._weights:
            self._weights = pointers
            self.graphs.clear()

    # -- the static step -----------------------------------------------------------------------
    def _pointers(self) -> int:
        return hash(tuple(p.data_ptr() for p in self.model.parameters()))

    def _buffers_key(self, kv: SlotCache) -> tuple[int, ...]:
        return (kv.buf_k[0].data_ptr(), kv.rows_cap, kv.cols_cap)

    def _step(self, kv: SlotCache, b: int) -> torch.Tensor:
        """The forward of a bucket of ``b`` rows over the whole buffers: what the graph records."""
        ids, pos, cols = self.inputs[0, :b], self.inputs[1, :b], self.inputs[2, :b]
        columns = torch.arange(kv.cols_cap, device=self.device)
        mask = (columns.view(1, -1) <= pos.view(-1, 1)).view(b, 1, 1, -1)
        kv.span, kv.attend = (0, b), kv.cols_cap
        kv.write_at = (self.rows_index[:b].view(b, 1), cols.view(b, 1))
        out = self.model(
            input_ids=ids.view(b, 1),
            attention_mask=model_mask(self.model, mask),
            position_ids=pos.view(b, 1),
            cache=kv,
            logits_to_keep=1,
        )
        return out.logits[:, -1]

    def _capture(self, kv: SlotCache, b: int) -> tuple[Any, torch.Tensor]:
        """Warm the step up on a side stream (lazy initialisation stays out of the graph), then
        record it. Other threads may use the GPU meanwhile (the trainer): ``thread_local``."""
        autocast = torch.is_autocast_enabled(self.device.type)
        dtype = torch.get_autocast_dtype(self.device.type)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.autocast(self.device.type, dtype, enabled=autocast, cache_enabled=False):
            with torch.cuda.stream(side):
                self._step(kv, b)  # writes the same keys and values the replay writes again
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = self._step(kv, b)
        self.captures += 1
        return graph, out

"""The decode step replayed as CUDA graphs: on a GPU a small model's decode step is kernel launches
and Python, not arithmetic, and a graph replays all its kernels with one launch. A graph fixes
shapes and addresses, so the step is static: rows padded to a bucket (a padding row writes to the
scratch column, its logits dropped), attention over every cache column, inputs in static buffers.
Weights are read where they live (in-place writes reach the next replay); capture runs with
autocast's cast cache off, so a cast is part of the graph, not a tensor cast once under old weights.
``capture=False`` runs the same static step eagerly (what the CPU tests compare)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .kv import SlotCache, last_logits


def buckets(max_rows: int) -> list[int]:
    """Row counts a graph is captured for: 1, 2, 4, 8, then every 8 up to ``max_rows`` (and it)."""
    sizes = [b for b in (1, 2, 4) if b < max_rows] + list(range(8, max_rows, 8)) + [max_rows]
    return sorted(set(sizes))


class StaticDecode:
    """The static decode step of one engine; ``capture``: recorded as CUDA graphs, else run eagerly."""

    def __init__(self, model: Any, device: torch.device, max_rows: int, capture: bool) -> None:
        self.model, self.device, self.max_rows, self.capture = model, device, max_rows, capture
        self.sizes = buckets(max_rows)
        # (3, max_rows): ids, positions, write columns of the step (padding rows: pad, 0, scratch)
        self.inputs = torch.zeros((3, max_rows), dtype=torch.long, device=device)
        self.rows_index = torch.arange(max_rows, device=device)
        self.captured: dict[int, tuple[Any, torch.Tensor]] = {}  # bucket → (CUDA graph, its logits)
        self._buffers: tuple[int, ...] | None = None  # the cache buffers the graphs were captured on
        self._weights = self._pointers()  # where the parameters the graphs read live
        self.captures = 0  # graphs captured (a counter for tests and the benchmark)
        self.broken: str | None = None  # why a capture failed: the engine then decodes eagerly

    def decode(self, kv: SlotCache, ids: list[int], pad_token_id: int) -> torch.Tensor | None:
        """One decode step of the batch's rows (row r feeds ``ids[r]``): each row's next-token logits,
        or None when its graph could not be captured (nothing committed: the caller decodes eagerly)."""
        n = len(ids)
        b = next(b for b in self.sizes if b >= n)
        kv.reserve(self.max_rows, max(kv.lens[:n]) + 1)
        buffers = (kv.buf_k[0].data_ptr(), kv.rows_cap, kv.cols_cap)
        if buffers != self._buffers:  # buffers grown: the captured graphs point elsewhere
            self.captured.clear()
            self._buffers = buffers
        pad = b - n  # padding rows: the pad id, position 0, the scratch column
        host = [ids + [pad_token_id] * pad, kv.lens[:n] + [0] * pad, kv.lens[:n] + [kv.cols_cap - 1] * pad]
        self.inputs[:, :b].copy_(torch.tensor(host, dtype=torch.long), non_blocking=True)
        if not self.capture:
            logits = self._step(kv, b)[:n]
        else:
            if b not in self.captured:
                try:
                    self.captured[b] = self._capture(kv, b)
                except RuntimeError as exc:  # an op the graph cannot record: decode eagerly from now on
                    self.broken = f"{type(exc).__name__}: {exc}"
                    warnings.warn(
                        f"CUDA graph capture failed, decoding without graphs: {self.broken}", stacklevel=2
                    )
                    return None
            graph, out = self.captured[b]
            graph.replay()
            logits = out[:n].clone()
        kv.commit((0, n), [1] * n)
        return logits

    def weights_changed(self) -> None:
        """New weights: written in place, the graphs read them as they are; new tensors: graphs dropped."""
        if (pointers := self._pointers()) != self._weights:
            self._weights = pointers
            self.captured.clear()

    # -- the static step -----------------------------------------------------------------------
    def _pointers(self) -> int:
        return hash(tuple(p.data_ptr() for p in self.model.parameters()))

    def _step(self, kv: SlotCache, b: int) -> torch.Tensor:
        """The forward of a bucket of ``b`` rows over the whole buffers: what the graph records."""
        ids, pos, cols = self.inputs[0, :b], self.inputs[1, :b], self.inputs[2, :b]
        columns = torch.arange(kv.cols_cap, device=self.device)
        mask = (columns.view(1, -1) <= pos.view(-1, 1)).view(b, 1, 1, -1)
        kv.span, kv.attend = (0, b), kv.cols_cap
        kv.write_at = (self.rows_index[:b].view(b, 1), cols.view(b, 1))
        return last_logits(self.model, ids.view(b, 1), pos.view(b, 1), mask, kv)

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

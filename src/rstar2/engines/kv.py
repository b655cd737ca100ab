"""The KV cache of a continuously batched engine: rows join, leave, and outlive their request.

``BatchKV`` holds the keys and values of every running sequence in one slot (row) each of
preallocated buffers, ``(rows, heads, columns, head_dim)`` per layer, that grow by doubling. Row r's
tokens are its columns ``[0, len_r)``: the column is the token's position, so no row is padded
to line up with the others. A forward pass over a range of rows writes each row's new tokens at
its own columns (a decode step: one column a row; a prefill: the new tokens, right-aligned in the
pass, padding written to a scratch column) and attends under a mask built from the rows'
lengths. A row joins by writing its own columns into the next free slot and leaves by the last
row moving into its slot: neither copies the rest of the batch (transformers' ``DynamicLayer``
concatenates the whole cache at every step; a left-padded batch copies it at every join).

``PrefixStore`` keeps the cache of a sequence whose request ended (a turn that stopped on a tool
call) within a token budget, least recently used first out, tagged with the weight version it was
computed under: the trajectory's next turn, whose prompt extends those tokens, prefills only what
is new, and a prefix computed under other weights is never used.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer


class SlotLayer(DynamicLayer):
    """One layer of a ``BatchKV``: ``update`` writes the new keys/values where the owner's plan
    says and hands attention the planned rows' first columns (a view, no copy)."""

    def __init__(self, owner: BatchKV) -> None:
        super().__init__()
        # a weak reference: a strong one would make a cycle (batch -> cache -> layer -> batch) that
        # only the cyclic garbage collector frees, holding gigabytes of buffers after the batch ends
        self._owner = weakref.ref(owner)
        self.buf_k: torch.Tensor | None = None
        self.buf_v: torch.Tensor | None = None

    @property
    def owner(self) -> BatchKV:
        owner = self._owner()
        if owner is None:
            raise RuntimeError("the batch this cache layer belonged to is gone")
        return owner

    def allocate(self, like_k: torch.Tensor, like_v: torch.Tensor) -> None:
        o = self.owner
        self.buf_k = like_k.new_zeros((o.rows_cap, like_k.shape[-3], o.cols_cap, like_k.shape[-1]))
        self.buf_v = like_v.new_zeros((o.rows_cap, like_v.shape[-3], o.cols_cap, like_v.shape[-1]))
        self.is_initialized, self.device = True, like_k.device

    def resize(self, rows: int, cols: int, keep_rows: int, keep_cols: int) -> None:
        for name in ("buf_k", "buf_v"):
            old = getattr(self, name)
            new = old.new_zeros((rows, old.shape[1], cols, old.shape[-1]))
            new[:keep_rows, :, :keep_cols] = old[:keep_rows, :, :keep_cols]
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        o = self.owner
        if self.buf_k is None:
            self.allocate(key_states, value_states)
        rows, cols = o.write_at
        self.buf_k[rows, :, cols] = key_states.transpose(1, 2)
        self.buf_v[rows, :, cols] = value_states.transpose(1, 2)
        a, b = o.span
        self.keys = self.buf_k[a:b, :, : o.attend]
        self.values = self.buf_v[a:b, :, : o.attend]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.owner.attend


@dataclass
class SeqKV:
    """One sequence's keys and values, per layer (1, H, L, D), for the token ids ``ids``."""

    ids: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    version: int
    shared: bool = False  # a prefix many requests start with (the system prompt): not consumed by use

    @property
    def length(self) -> int:
        return len(self.ids)


class BatchKV:
    """The running rows' cache (see the module docstring). ``lens[r]``: tokens row r holds."""

    def __init__(self, device: torch.device | str = "cpu", max_rows: int | None = None) -> None:
        self.device = torch.device(device)
        self.max_rows = max_rows  # rows are never reserved beyond it (the engine's batch size)
        self.lens: list[int] = []
        self.rows_cap = self.cols_cap = 0
        me = weakref.ref(self)  # (no cycle through the cache's layer factory either)
        self.cache = Cache(layer_class_to_replicate=lambda: SlotLayer(me()))
        # the plan of the next forward pass (set by ``plan``, read by every layer's ``update``)
        self.span = (0, 0)
        self.write_at: tuple[torch.Tensor, torch.Tensor] | None = None
        self.attend = 0

    @property
    def rows(self) -> int:
        return len(self.lens)

    def layers(self) -> list[SlotLayer]:
        return [layer for layer in self.cache.layers if getattr(layer, "buf_k", None) is not None]

    def _reserve(self, rows: int, cols: int) -> None:
        """Room for ``rows`` rows of ``cols`` columns, plus the scratch column (growing by half, so
        the copies stay amortised while the spare room stays small: every row pays for the
        longest one's columns)."""
        cols += 1
        if rows <= self.rows_cap and cols <= self.cols_cap:
            return
        new_rows = self.rows_cap if rows <= self.rows_cap else max(rows, 2 * self.rows_cap)
        if self.max_rows is not None:
            new_rows = max(rows, min(new_rows, self.max_rows))
        new_cols = (
            self.cols_cap if cols <= self.cols_cap else _round_up(max(cols, self.cols_cap * 3 // 2), 64)
        )
        keep_cols = max(self.lens, default=0)
        for layer in self.layers():
            layer.resize(new_rows, new_cols, self.rows, keep_cols)
        self.rows_cap, self.cols_cap = new_rows, new_cols

    def add(self, seqs: list[SeqKV | None]) -> None:
        """Rows holding these sequences (None: an empty row) after the running ones."""
        first = self.rows
        self._reserve(first + len(seqs), max((s.length for s in seqs if s is not None), default=0))
        template = next((s for s in seqs if s is not None and s.length), None)
        if template is not None and not self.cache.layers:
            for k, v in zip(template.keys, template.values, strict=True):
                layer = SlotLayer(self)
                layer.allocate(k, v)
                self.cache.layers.append(layer)
        layers = self.layers()
        for r, s in enumerate(seqs, start=first):
            self.lens.append(s.length if s is not None else 0)
            if s is None or not s.length:
                continue
            if len(s.keys) != len(layers):
                raise RuntimeError("a kept sequence has another layer count than the running batch")
            for layer, k, v in zip(layers, s.keys, s.values, strict=True):
                layer.buf_k[r, :, : s.length] = k[0]
                layer.buf_v[r, :, : s.length] = v[0]

    def plan(self, span: tuple[int, int], new: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Set up a forward pass over rows ``span`` whose ``width`` input columns hold each row's
        ``new[r]`` tokens right-aligned (left padding). Returns the position ids (rows, width) and
        the boolean attention mask (rows, 1, width, attended columns): a token sees its row's
        columns up to its own position. Padding writes to the scratch column and sees column 0."""
        a, b = span
        device = self.device
        lens = torch.tensor(self.lens[a:b], dtype=torch.long, device=device)
        count = torch.tensor(new, dtype=torch.long, device=device)
        self.attend = int((lens + count).max())
        self._reserve(b, self.attend)
        step = torch.arange(width, device=device)
        pos = lens.unsqueeze(1) + step.unsqueeze(0) - (width - count).unsqueeze(1)
        real = pos >= lens.unsqueeze(1)
        cols = torch.where(real, pos, torch.full_like(pos, self.cols_cap - 1))
        rows = torch.arange(a, b, device=device).unsqueeze(1).expand(-1, width)
        self.span, self.write_at = (a, b), (rows, cols)
        pos = pos.clamp(min=0)
        mask = torch.arange(self.attend, device=device).view(1, 1, -1) <= pos.unsqueeze(2)
        return pos, mask.unsqueeze(1)

    def commit(self, span: tuple[int, int], new: list[int]) -> None:
        """The planned pass ran: its rows hold their new tokens."""
        for r, n in zip(range(*span), new, strict=True):
            self.lens[r] += n

    def copy_row(self, src: int) -> None:
        """A new last row holding what row ``src`` holds (identical prompts prefilled once)."""
        self._reserve(self.rows + 1, 0)
        n, dst = self.lens[src], self.rows
        for layer in self.layers():
            layer.buf_k[dst, :, :n] = layer.buf_k[src, :, :n]
            layer.buf_v[dst, :, :n] = layer.buf_v[src, :, :n]
        self.lens.append(n)

    def remove(self, row: int) -> None:
        """Row ``row`` leaves; the last row moves into its slot (callers reorder alike)."""
        last = self.rows - 1
        if row != last:
            n = self.lens[last]
            for layer in self.layers():
                layer.buf_k[row, :, :n] = layer.buf_k[last, :, :n]
                layer.buf_v[row, :, :n] = layer.buf_v[last, :, :n]
            self.lens[row] = n
        self.lens.pop()

    def truncate(self, rows: int) -> None:
        """Only the first ``rows`` rows stay (a join that failed half-way is undone)."""
        del self.lens[rows:]

    def sequence(self, row: int, ids: tuple[int, ...], version: int, shared: bool = False) -> SeqKV:
        """A copy of one row's columns, for ``PrefixStore``."""
        n = self.lens[row]
        if n != len(ids):
            raise RuntimeError(f"row {row} holds {n} tokens, not the {len(ids)} named")
        keys = [layer.buf_k[row : row + 1, :, :n].clone() for layer in self.layers()]
        values = [layer.buf_v[row : row + 1, :, :n].clone() for layer in self.layers()]
        return SeqKV(ids, keys, values, version, shared)


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


class PrefixStore:
    """Sequences' caches kept for their next turn, within ``budget_tokens``, LRU."""

    def __init__(self, budget_tokens: int) -> None:
        self.budget_tokens = budget_tokens
        self._entries: OrderedDict[int, SeqKV] = OrderedDict()
        self._next = 0
        self.tokens = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0

    def put(self, seq: SeqKV) -> None:
        if seq.length == 0 or seq.length > self.budget_tokens:
            return
        self._entries[self._next] = seq
        self._next += 1
        self.tokens += seq.length
        while self.tokens > self.budget_tokens:
            _, old = self._entries.popitem(last=False)
            self.tokens -= old.length
            self.evicted += 1

    def take(self, prompt: list[int], version: int) -> SeqKV | None:
        """The longest kept sequence that ``prompt`` extends (at least one new token after it),
        removed from the store unless it is shared; entries of another weight version are
        dropped on the way."""
        best_key, best = None, None
        for key, seq in list(self._entries.items()):
            if seq.version != version:
                del self._entries[key]
                self.tokens -= seq.length
                continue
            n = seq.length
            if n < len(prompt) and (best is None or n > best.length) and tuple(prompt[:n]) == seq.ids:
                best_key, best = key, seq
        if best_key is not None:
            if best.shared:
                self._entries.move_to_end(best_key)
            else:
                del self._entries[best_key]
                self.tokens -= best.length
        return best


def common_prefix(seqs: list[list[int]]) -> int:
    """Length of the longest prefix all of ``seqs`` share."""
    if not seqs:
        return 0
    first, n = seqs[0], min(len(q) for q in seqs)
    for other in seqs[1:]:
        i = 0
        while i < n and other[i] == first[i]:
            i += 1
        n = i
    return n

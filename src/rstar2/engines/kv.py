"""The KV cache of a continuously batched engine: rows join, leave, and outlive their request.

``BatchKV`` holds the keys and values of every running sequence, one row each, in
preallocated buffers that grow by doubling (transformers' ``DynamicLayer`` concatenates the whole
cache at every decode step; here a step writes one column). Each row's tokens are columns of the
buffer; ``mask`` says which columns are its own (a row that joined later, or whose new tokens were
shorter than its batch-mates', has padding columns that attention skips) and ``next_pos`` the
position its next token takes. Rows join by concatenation (the narrower side padded on the
left), leave by selection, and columns no row uses any more are trimmed from the left.

``PrefixStore`` keeps the cache of a sequence whose request ended (a turn that stopped on a tool
call) within a token budget, least recently used first out, tagged with the weight version it was
computed under: the trajectory's next turn, whose prompt extends those tokens, prefills only what
is new, and a prefix computed under other weights is never used.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` over a buffer with spare columns: ``update`` writes in place and hands
    attention a view of the filled part, so a decode step copies one column, not the cache."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.buf_k: torch.Tensor | None = None
        self.buf_v: torch.Tensor | None = None
        self.length = 0

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, spare: int) -> None:
        """Hold ``keys``/``values`` (B, H, L, D) with room for ``spare`` more columns."""
        b, h, length, d = keys.shape
        self.device = keys.device
        self.is_initialized = True
        self.buf_k = keys.new_empty((b, h, length + spare, d))
        self.buf_v = values.new_empty((b, h, length + spare, values.shape[-1]))
        self.buf_k[:, :, :length] = keys
        self.buf_v[:, :, :length] = values
        self.length = length
        self._views()

    def take_rows(self, index: torch.Tensor) -> None:
        self.buf_k = self.buf_k.index_select(0, index)
        self.buf_v = self.buf_v.index_select(0, index)
        self._views()

    def _views(self) -> None:
        self.keys = self.buf_k[:, :, : self.length]
        self.values = self.buf_v[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized or self.buf_k is None:
            self.adopt(key_states, value_states, spare=max(16, key_states.shape[-2]))
            return self.keys, self.values
        new = key_states.shape[-2]
        if self.length + new > self.buf_k.shape[-2]:
            keys, values = self.keys, self.values
            self.adopt(keys, values, spare=max(new, self.length))  # double
        self.buf_k[:, :, self.length : self.length + new] = key_states
        self.buf_v[:, :, self.length : self.length + new] = value_states
        self.length += new
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized and self.buf_k is not None else 0


def new_cache() -> Cache:
    return Cache(layer_class_to_replicate=GrowingLayer)


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
    """The running rows' cache (see the module docstring)."""

    def __init__(self, cache: Cache, mask: torch.Tensor, next_pos: torch.Tensor) -> None:
        self.cache, self.mask, self.next_pos = cache, mask, next_pos

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @property
    def width(self) -> int:
        return self.mask.shape[1]

    def layers(self) -> list[GrowingLayer]:
        return [layer for layer in self.cache.layers if getattr(layer, "buf_k", None) is not None]

    @classmethod
    def from_sequences(cls, seqs: list[SeqKV | None], device: torch.device) -> BatchKV:
        """Rows holding the given sequences (None: an empty row), right-aligned, left-padded."""
        width = max((s.length for s in seqs if s is not None), default=0)
        n = len(seqs)
        mask = torch.zeros((n, width), dtype=torch.long, device=device)
        next_pos = torch.zeros(n, dtype=torch.long, device=device)
        cache = new_cache()
        if width == 0:
            return cls(cache, mask, next_pos)
        template = next(s for s in seqs if s is not None)
        for i, s in enumerate(seqs):
            if s is not None and s.length:
                mask[i, width - s.length :] = 1
                next_pos[i] = s.length
        spare = max(64, width // 2)  # the new tokens about to be prefilled after it
        for li in range(len(template.keys)):
            k0, v0 = template.keys[li], template.values[li]
            layer = GrowingLayer()
            layer.is_initialized, layer.device, layer.length = True, k0.device, width
            layer.buf_k = k0.new_zeros((n, k0.shape[1], width + spare, k0.shape[-1]))
            layer.buf_v = v0.new_zeros((n, v0.shape[1], width + spare, v0.shape[-1]))
            for i, s in enumerate(seqs):
                if s is not None and s.length:
                    layer.buf_k[i, :, width - s.length : width] = s.keys[li][0]
                    layer.buf_v[i, :, width - s.length : width] = s.values[li][0]
            layer._views()
            cache.layers.append(layer)
        return cls(cache, mask, next_pos)

    def grow(self, new_mask: torch.Tensor) -> None:
        """Columns about to be written by a forward pass: ``new_mask`` (rows, n) marks real tokens."""
        self.mask = torch.cat([self.mask, new_mask], dim=1)
        self.next_pos = self.next_pos + new_mask.sum(dim=1)

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows``, in that order (one copy of the kept rows, spare columns included)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]
        for layer in self.layers():
            layer.take_rows(index)
        self.trim()

    def trim(self) -> None:
        """Drop leading columns no row uses (the longest row left)."""
        if self.width == 0 or self.rows == 0:
            return
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else self.width
        if first < max(8, self.width // 8):
            return
        self.mask = self.mask[:, first:]
        for layer in self.layers():
            layer.adopt(
                layer.keys[:, :, first:], layer.values[:, :, first:], spare=max(16, layer.length // 4)
            )

    def extend(self, other: BatchKV) -> None:
        """Append ``other``'s rows (both sides left-padded to the wider width)."""
        if other.rows == 0:
            return
        if self.rows == 0:
            self.cache, self.mask, self.next_pos = other.cache, other.mask, other.next_pos
            return
        width = max(self.width, other.width)
        mine, theirs = self.layers(), other.layers()
        if len(mine) != len(theirs):
            raise RuntimeError("cannot join caches of different layer counts")
        self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(other.mask, width)], dim=0)
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        n = self.rows
        for a, b in zip(mine, theirs, strict=True):  # one new buffer, each side written once
            spare = max(64, width // 4)
            keys = a.keys.new_zeros((n, a.keys.shape[1], width + spare, a.keys.shape[-1]))
            values = a.values.new_zeros((n, a.values.shape[1], width + spare, a.values.shape[-1]))
            na = a.keys.shape[0]
            keys[:na, :, width - a.length : width] = a.keys
            values[:na, :, width - a.length : width] = a.values
            keys[na:, :, width - b.length : width] = b.keys
            values[na:, :, width - b.length : width] = b.values
            a.buf_k, a.buf_v, a.length = keys, values, width
            a._views()

    def sequence(self, row: int, ids: tuple[int, ...], version: int, shared: bool = False) -> SeqKV:
        """A copy of one row's own columns (its padding left out), for ``PrefixStore``."""
        own = self.mask[row].bool()
        if int(own.sum()) != len(ids):
            raise RuntimeError(f"row {row} holds {int(own.sum())} tokens, not the {len(ids)} named")
        keys = [layer.keys[row : row + 1][:, :, own].clone() for layer in self.layers()]
        values = [layer.values[row : row + 1][:, :, own].clone() for layer in self.layers()]
        return SeqKV(ids, keys, values, version, shared)


def _pad_left(mask: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - mask.shape[1]
    return mask if missing <= 0 else torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], dim=1)


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

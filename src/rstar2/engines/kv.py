"""The KV cache of a continuously batched engine. ``SlotCache``: per layer one key and one value
buffer of ``(rows, heads, columns, head_dim)``; row r's tokens are its columns ``[0, len_r)``, so no
row is padded to line up with the others, and a row joins or leaves (the last row moving into its
slot) without copying the rest of the batch (``DynamicCache`` concatenates it all every step).
``PrefixStore``: ended requests' caches kept for their trajectory's next turn (LRU, token budget)."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache


@dataclass
class SeqKV:
    """One sequence's keys and values, per layer (1, H, L, D), for the token ids ``ids``."""

    ids: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    shared: bool = False  # a prefix many requests start with (a group's prompt): not consumed by use

    @property
    def length(self) -> int:
        return len(self.ids)


class SlotCache(Cache):
    """The running rows' cache. ``lens[r]``: tokens row r holds; ``owners[r]``: what occupies it."""

    def __init__(self, device: torch.device | str = "cpu", max_rows: int | None = None) -> None:
        super().__init__(layers=[])  # the buffers are this object's own, not per-layer objects
        self.device = torch.device(device)
        self.max_rows = max_rows  # rows are never reserved beyond it (the engine's batch size)
        self.buf_k: list[torch.Tensor] = []  # one per model layer
        self.buf_v: list[torch.Tensor] = []
        self.lens: list[int] = []
        self.owners: list[Any] = []
        self.rows_cap = self.cols_cap = 0
        # the plan of the next forward pass (set by ``plan``, read by every layer's ``update``)
        self.span = (0, 0)
        self.write_at: tuple[torch.Tensor, torch.Tensor] | None = None
        self.attend = 0

    @property
    def rows(self) -> int:
        return len(self.lens)

    # -- what the model calls ---------------------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write the layer's new keys/values where the plan says; hand attention the planned rows'
        first ``attend`` columns (a view, no copy)."""
        if layer_idx == len(self.buf_k):
            self._allocate(key_states, value_states)
        rows, cols = self.write_at
        k, v = self.buf_k[layer_idx], self.buf_v[layer_idx]
        k[rows, :, cols] = key_states.transpose(1, 2).to(k.dtype)
        v[rows, :, cols] = value_states.transpose(1, 2).to(v.dtype)
        a, b = self.span
        return k[a:b, :, : self.attend], v[a:b, :, : self.attend]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.attend

    # -- the engine's side ------------------------------------------------------------------
    def _allocate(self, key: torch.Tensor, value: torch.Tensor) -> None:
        """The next layer's buffers, shaped after its keys and values (batch, heads, tokens,
        head_dim), each of its own dtype: under bf16 autocast the values are bf16 while the keys,
        rotated by fp32 cos/sin, come out fp32 (transformers 5.24)."""
        for buf, like in ((self.buf_k, key), (self.buf_v, value)):
            buf.append(like.new_zeros((self.rows_cap, like.shape[-3], self.cols_cap, like.shape[-1])))

    def reserve(self, rows: int, cols: int) -> None:
        """Room for ``rows`` rows of ``cols`` columns, plus the scratch column (growing by half, so
        the copies stay amortised while the spare room stays small: every row pays for the
        longest one's columns)."""
        cols += 1
        if rows <= self.rows_cap and cols <= self.cols_cap:
            return
        new_rows = self.rows_cap if rows <= self.rows_cap else max(rows, 2 * self.rows_cap)
        if self.max_rows is not None:
            new_rows = max(rows, min(new_rows, self.max_rows))
        new_cols = self.cols_cap
        if cols > self.cols_cap:  # a multiple of 64
            new_cols = math.ceil(max(cols, self.cols_cap * 3 // 2) / 64) * 64
        keep_cols = max(self.lens, default=0)
        for bufs in (self.buf_k, self.buf_v):
            for i, old in enumerate(bufs):
                new = old.new_zeros((new_rows, old.shape[1], new_cols, old.shape[-1]))
                new[: self.rows, :, :keep_cols] = old[: self.rows, :, :keep_cols]
                bufs[i] = new
        self.rows_cap, self.cols_cap = new_rows, new_cols

    def clear(self) -> None:
        """No rows; the buffers kept (an engine replaying CUDA graphs over them keeps its graphs)."""
        self.lens.clear()
        self.owners.clear()

    def add(self, seqs: list[SeqKV | None], owners: list[Any]) -> None:
        """Rows after the running ones holding these sequences (None: empty), occupied by ``owners``."""
        first = self.rows
        self.reserve(first + len(seqs), max((s.length for s in seqs if s is not None), default=0))
        template = next((s for s in seqs if s is not None and s.length), None)
        if template is not None and not self.buf_k:
            for k, v in zip(template.keys, template.values, strict=True):
                self._allocate(k, v)
        for r, (s, owner) in enumerate(zip(seqs, owners, strict=True), start=first):
            self.lens.append(s.length if s is not None else 0)
            self.owners.append(owner)
            if s is None or not s.length:
                continue
            if len(s.keys) != len(self.buf_k):
                raise RuntimeError("a kept sequence has another layer count than the running batch")
            for buf_k, buf_v, k, v in zip(self.buf_k, self.buf_v, s.keys, s.values, strict=True):
                buf_k[r, :, : s.length] = k[0]
                buf_v[r, :, : s.length] = v[0]

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
        self.reserve(b, self.attend)
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

    def _move(self, src: int, dst: int) -> None:
        n = self.lens[src]
        for bufs in (self.buf_k, self.buf_v):
            for buf in bufs:
                buf[dst, :, :n] = buf[src, :, :n]

    def copy_row(self, src: int, owner: Any) -> None:
        """A new last row, occupied by ``owner``, holding what row ``src`` holds."""
        self.reserve(self.rows + 1, 0)
        self._move(src, self.rows)
        self.lens.append(self.lens[src])
        self.owners.append(owner)

    def remove(self, row: int) -> None:
        """Row ``row`` leaves; the last row (cache and owner) moves into its slot."""
        last = self.rows - 1
        if row != last:
            self._move(last, row)
            self.lens[row], self.owners[row] = self.lens[last], self.owners[last]
        self.lens.pop()
        self.owners.pop()

    def truncate(self, rows: int) -> None:
        """Only the first ``rows`` rows stay (a join that failed half-way is undone)."""
        del self.lens[rows:], self.owners[rows:]

    def sequence(self, row: int, ids: tuple[int, ...], shared: bool = False) -> SeqKV:
        """A copy of one row's columns, for ``PrefixStore``."""
        n = self.lens[row]
        if n != len(ids):
            raise RuntimeError(f"row {row} holds {n} tokens, not the {len(ids)} named")
        keys = [buf[row : row + 1, :, :n].clone() for buf in self.buf_k]
        values = [buf[row : row + 1, :, :n].clone() for buf in self.buf_v]
        return SeqKV(ids, keys, values, shared)


def last_logits(
    model: Any, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, kv: SlotCache
) -> torch.Tensor:
    """One pass of ``model`` over the rows ``kv`` planned; the logits of each row's last token. The
    boolean ``mask`` as the attention takes it: sdpa the booleans, eager attention adds it to the
    scores (0 where seen, the lowest value not)."""
    if getattr(model.config, "_attn_implementation", None) == "eager":
        lowest = torch.finfo(model.dtype).min
        mask = torch.zeros(mask.shape, dtype=model.dtype, device=mask.device).masked_fill(~mask, lowest)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=kv, logits_to_keep=1)
    return out.logits[:, -1]


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

    def take(self, prompt: list[int]) -> SeqKV | None:
        """The longest kept sequence that ``prompt`` extends (at least one new token after it),
        removed from the store unless it is shared."""
        best_key, best = None, None
        for key, seq in self._entries.items():
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

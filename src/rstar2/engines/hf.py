"""``HFEngine``: a transformers model served to concurrent async callers with continuous batching:
its thread, its queue and the weights rule (checked before every step, nowhere else); the batch
and its KV are ``batch.py`` and ``kv.py``. Not transformers' own continuous batching: slower here,
it kept prefixes computed under old weights, failed every request in flight on one bad request,
and has no per-request seed, banned ids or finish reason."""

from __future__ import annotations

import asyncio
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..adapters import adapted, base_names, load_adapter_into, load_model, unload
from ..config import DEFAULT_ASYNC, DEFAULT_ROLLOUT
from ..device import decode_compute, engine_dtype, max_positions, pick_device, resolve_precision
from .base import Generation, SamplingParams, WeightUpdate
from .batch import Request, Row, RunningBatch
from .budget import engine_budget
from .kv import PrefixStore


def weights_stamp(model: Any) -> int:
    """Changes whenever a parameter is written in place (optimizer step, ``load_state_dict``) or
    replaced: torch counts in-place writes per tensor, except those through ``param.data``
    (``HFEngine.invalidate`` is for those)."""
    return hash(tuple((p.data_ptr(), p._version) for p in model.parameters()))


class HFEngine:
    """A transformers causal LM behind the ``LocalEngine`` protocol."""

    version_source = "tokens"  # each token says which policy version sampled it
    local = True

    gather_s = 0.01  # seconds of quiet that end a burst of arrivals (``_admit``)

    def __init__(
        self,
        model: Any,
        *,
        name: str = "hf",
        max_batch_size: int = DEFAULT_ROLLOUT.engine.max_batch_size,
        capacity_tokens: int | None = None,
        keep_tokens: int | None = None,
        compute: str = "auto",
        keep_stale_kv: bool = DEFAULT_ASYNC.keep_stale_kv,
        cuda_graphs: bool | None = None,
    ) -> None:
        self.model = model.eval()
        # decode as CUDA graphs (graphs.py); None: on a CUDA device; True on a CPU: the static step
        self.cuda_graphs = cuda_graphs
        # on new weights, the running rows keep the KV computed under the old ones instead of prefilling again
        self.keep_stale_kv = keep_stale_kv
        attention = getattr(model.config, "_attn_implementation", None) or "sdpa"
        if attention not in ("sdpa", "eager"):
            raise ValueError(
                f"HFEngine batches rows of different lengths under its own attention mask, which "
                f"'{attention}' attention does not take; load the model with attn_implementation='sdpa'"
            )
        self.compute = compute  # the trainer's model.compute; decode_compute() picks the engine's
        self.name, self.max_batch_size = name, max_batch_size
        # the kept prefixes' budget comes out of the capacity the scheduler may grant
        self.capacity_tokens, self.keep_tokens = engine_budget(
            max_batch_size, max_positions(model), capacity_tokens, keep_tokens
        )
        self.prefix_cache = self.keep_tokens > 0
        self.store = PrefixStore(self.keep_tokens)
        self.pad_token_id = model.config.pad_token_id or 0
        self.lock = threading.Lock()  # held during a step; take it through ``paused()``
        # held by a caller waiting for ``lock``: the engine's thread does not start another step
        # meanwhile (a thread that releases a lock and takes it again at once starves the others)
        self._gate = threading.Lock()
        self._queue: queue.Queue[Request | None] = queue.Queue()
        self._pending: deque[Request] = deque()
        self.in_flight = 0
        self._thread: threading.Thread | None = None
        self.static_decode: Any = None  # its batch's ``StaticDecode`` once its thread starts, if used
        self._batch: RunningBatch | None = None  # its running batch once its thread starts
        self._closed = False
        self.broken: str | None = None  # why the weights are not whole (a load failed half way)
        self._weight_writes = 0  # weight writes told to the engine (update_weights, invalidate)
        self.version = 0  # the policy version of its weights (the trainer's updates so far), as told
        # torch threads of the engine's thread now (None: the process's); a trainer whose update
        # runs beside it lowers this meanwhile, so two OpenMP teams do not share the same cores
        self.threads: int | None = None
        self._stamp: tuple[int, int] | None = None  # (_weight_writes, weights_stamp) of the batch
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
            "abandoned": 0,  # requests whose caller stopped waiting (its client gone, streamed or not): dropped
            "prefill_s": 0.0,  # of busy_s: admissions (prefill, joining the batch)
        }

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, device: str = "auto", dtype: str = "auto", **kw: Any
    ) -> HFEngine:
        dev = pick_device(device)
        model = load_model(path, engine_dtype(dev, dtype)).to(dev)  # an adapter checkpoint merged
        return cls(model, name=kw.pop("name", Path(path).name), **kw)

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_token: Callable[[int, float], None] | None = None,
    ) -> Generation:
        """``on_token``: called on this event loop with each token and its log-prob as it is
        sampled (a streaming answer), all of them before the generation returns."""
        if self._closed:
            raise RuntimeError(f"engine {self.name} is closed")
        if self.broken:  # (requests already queued fail in the engine's thread)
            raise self._not_whole()
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        vocab = self.model.get_input_embeddings().num_embeddings
        if (bad := next((t for t in prompt_ids if not 0 <= t < vocab), None)) is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary (0..{vocab - 1})")
        if len(prompt_ids) >= (positions := max_positions(self.model)):
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens leaves no room in the model's {positions} positions"
            )
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=f"engine-{self.name}", daemon=True)
            self._thread.start()
        loop = asyncio.get_running_loop()
        req = Request(list(prompt_ids), params, loop, loop.create_future(), time.perf_counter(), on_token)
        self.in_flight += 1
        try:
            self._queue.put(req)
            return await req.future
        finally:
            self.in_flight -= 1

    async def load_weights(self, update: WeightUpdate) -> dict[str, Any]:
        """The trainer's tensors, loaded off the event loop and then checked held exactly; none: it
        decodes the trainer's own model, written in place, and only says so (torch does not count
        every kind of write, e.g. through ``param.data``)."""
        if update.folder is not None:
            raise ValueError(f"engine {self.name} runs in this process: it takes tensors, not a folder")
        if update.tensors is None:
            await asyncio.to_thread(self.invalidate, update.version)
            return {"weights_version": update.version}

        def load() -> float:
            sent = {k: v.to(self.model.dtype) for k, v in update.tensors.items()}  # type: ignore[union-attr]
            self.update_weights(sent, update.version)
            return self.held_difference(sent)

        diff = await asyncio.to_thread(load)
        if diff != 0.0:
            raise RuntimeError(
                f"engine {self.name} holds other weights than the trainer sent as version "
                f"{update.version} (largest difference {diff:g})"
            )
        return {"weights_version": update.version}

    def held_difference(self, sent: dict[str, torch.Tensor]) -> float:
        """0.0 when the engine holds exactly ``sent`` (one comparison a tensor, no temporaries); else
        the largest |held - sent| of the first tensor that differs (inf for one it lacks:
        ``load_state_dict(strict=False)`` skips unknown names)."""
        with self.paused():
            held = self.model.state_dict()
            for name, tensor in sent.items():
                own = held.get(name)
                if own is None or own.shape != tensor.shape:
                    return float("inf")
                tensor = tensor.to(own.device)
                if not torch.equal(own, tensor):
                    return float((own - tensor).abs().max())
        return 0.0

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Names and shapes are checked before anything is written; a write that fails half way
        leaves the engine refusing requests until a load succeeds, never serving half a model."""
        with self.paused():
            held = self.model.state_dict()
            # a whole model into one holding an adapter (served): the adapter goes, nothing of it stays
            # on; an in-process copy of an adapted model takes the adapter's tensors by their names
            whole = adapted(self.model) and not any(".lora_" in k for k in state_dict)
            names = base_names(self.model) if whole else {k: k for k in held}
            unknown = sorted(set(state_dict) - set(names))
            wrong = [k for k in state_dict if k in names and state_dict[k].shape != held[names[k]].shape]
            if unknown or wrong:
                raise ValueError(
                    f"engine {self.name}: the new weights do not fit the model "
                    f"(unknown tensors {unknown[:5]}, other shapes {wrong[:5]}); nothing was loaded"
                )
            with self._loading(version):
                if whole:
                    unload(self.model)
                self.model.load_state_dict(state_dict, strict=False)

    def update_adapter(self, folder: str | Path, version: int) -> int:
        """The adapter of ``folder`` (``rstar2.adapters``) over the base weights held, as ``version``:
        checked before anything is written, like ``update_weights``; how many tensors."""
        with self.paused(), self._loading(version):
            return load_adapter_into(self.model, folder)

    @contextmanager
    def _loading(self, version: int) -> Iterator[None]:
        """A write of new weights as ``version``; one failing half way (not a ``ValueError``) breaks it."""
        try:
            yield
        except ValueError:
            raise
        except BaseException as exc:
            self.broken = f"a weight load of version {version} failed half way ({exc})"
            raise
        self.broken = None
        self._new_weights(version)

    def invalidate(self, version: int) -> None:
        with self.paused():
            self._new_weights(version)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The caller waits for the step in progress only, not for the steps the engine would start next."""
        with self._gate, self.lock:
            yield

    @property
    def running(self) -> int:
        """Rows in the running batch now (a gauge; ``in_flight`` also counts the queued, and drops
        as soon as a caller stops waiting, before its row has left)."""
        return len(self._batch.rows) if self._batch is not None else 0

    async def counters(self) -> dict[str, Any]:
        return {**self.stats, "evictions": self.store.evicted, "rows": self.max_batch_size}

    def _new_weights(self, version: int) -> None:
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"engine {self.name}: a weight write needs its policy version, got {version!r}")
        self._weight_writes += 1
        self.version = version

    async def close(self) -> None:
        """Stop the engine's thread and drop the kept prefixes (up to ``keep_tokens`` of KV: a
        closed engine that something still references must not hold them)."""
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            await asyncio.to_thread(self._thread.join, 30)
        with self.paused():
            self.store.clear()

    # -- the engine's own thread -------------------------------------------------------------
    def _admit(self, free: int, wait: bool) -> list[Request] | None:
        """Requests to join now (at most ``free``). With nothing running (``wait``), block for the
        first and gather the rest of its burst; else take what has arrived. None: closing."""
        if wait and not self._pending:
            first = self._queue.get()
            if first is None:
                return None
            self._pending.append(first)
        # a burst (a rollout batch starting, tool calls returning together) arrives a little apart:
        # gather until the queue has been quiet for ``gather_s``, at most 10 windows
        deadline = time.perf_counter() + 10 * self.gather_s
        while True:
            gather = wait and len(self._pending) < free
            left = min(self.gather_s, deadline - time.perf_counter()) if gather else 0
            try:
                nxt = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                self._queue.put(None)  # seen again once the running rows are done
                break
            self._pending.append(nxt)
        waiting = [r for r in self._pending if not r.abandoned]  # the others' callers stopped waiting
        self.stats["abandoned"] += len(self._pending) - len(waiting)  # they never start
        if len(waiting) > free:  # short of rows: by priority, then arrival (a stable sort)
            waiting.sort(key=lambda r: r.params.priority)
        taken, self._pending = waiting[:free], deque(waiting[free:])
        now = time.perf_counter()
        self.stats["queue_wait_s"] += sum(now - r.arrived for r in taken)
        return taken

    def _serve(self) -> None:
        device = next(self.model.parameters()).device
        # resolved once: the hardware does not change while the engine serves
        bf16 = resolve_precision(device, decode_compute(device, self.compute)).resolved == "bf16"
        store = self.store if self.prefix_cache else None
        cuda_graphs = self.cuda_graphs if self.cuda_graphs is not None else device.type == "cuda"
        batch = RunningBatch(
            self.model, device, self.max_batch_size, self.pad_token_id, store, self.stats, cuda_graphs
        )
        self.static_decode, self._batch = batch.static_decode, batch
        own = applied = torch.get_num_threads()
        while True:
            new = self._admit(self.max_batch_size - len(batch.rows), wait=not batch.rows)
            if new is None and not batch.rows:
                break
            if (self.threads or own) != applied:  # this thread's team (torch: the calling thread's)
                applied = self.threads or own
                torch.set_num_threads(applied)
            with self._gate:  # a caller waiting in ``paused()`` goes first
                pass
            start = time.perf_counter()
            with torch.no_grad(), self.lock, torch.autocast(device.type, torch.bfloat16, enabled=bf16):
                if self.broken:  # a load failed half way: nothing is sampled from what it left
                    error = self._not_whole()
                    for req in [row.req for row in batch.rows] + (new or []):
                        req.settle(error)
                    batch.reset()
                    continue
                if (stamp := (self._weight_writes, weights_stamp(self.model))) != self._stamp:  # new weights
                    self._stamp = stamp
                    batch.version = self.version
                    if batch.static_decode is not None:
                        batch.static_decode.weights_changed()
                    # kept prefixes are dropped always: a later request (another group, admitted
                    # many versions on) would read them; with keep_stale_kv the running rows keep
                    # theirs, computed since their admission, which the trainer's bound covers
                    self.store.clear()
                    if batch.rows and not self.keep_stale_kv:
                        self.stats["reprefills"] += len(batch.rows)
                        batch.guarded(list(batch.rows), batch.refill)
                if new:
                    t0 = time.perf_counter()
                    rows = [self._row(r) for r in new]
                    if not batch.guarded(rows, lambda rows=rows: batch.join(rows), fail=len(rows) == 1):
                        for row in rows:  # one of them is bad: each joins alone, the bad one fails alone
                            batch.guarded([row], lambda row=row: batch.join([row]))
                    self.stats["prefill_s"] += time.perf_counter() - t0
                if batch.rows:
                    batch.guarded(list(batch.rows), batch.step)
            self.stats["busy_s"] += time.perf_counter() - start

    def _not_whole(self) -> RuntimeError:
        return RuntimeError(f"engine {self.name} holds no whole weights: {self.broken}; load them again")

    def _row(self, req: Request) -> Row:
        budget = min(req.params.max_new_tokens, max_positions(self.model) - len(req.prompt_ids))
        seed = req.params.seed
        self.stats["requests"] += 1
        return Row(req, budget, random.Random(seed) if seed is not None else None)

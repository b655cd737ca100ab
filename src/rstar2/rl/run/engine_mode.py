"""How the RL trainer's engines hold its weights, decided once per run: ``shared`` (one process,
synchronous, in-process: the engine decodes the trainer's own model), ``copy`` (in-process with
weights of its own: under torchrun, where the trained model is sharded, or while the update writes
the weights at ``max_staleness > 0``), or ``servers`` (loading each version from disk)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch

from ...config import RLConfig
from ...device import engine_dtype
from ...engines.base import Engine
from ..algorithm.staleness import StalenessError
from . import distributed as D
from .content_check import ContentCheck
from .launch import quietly
from .sync import WeightSyncError, load_into_servers, publish, whole_parts

PROBE_PROBLEM = "What is 12 + 30?"  # the prompt each server samples from after a weight sync
Mode = Literal["shared", "copy", "servers"]


def require_reported_versions(engines: Sequence[Engine], max_staleness: int) -> None:
    """Every engine must say which policy version sampled its tokens; one that only states the
    version it holds will do at ``max_staleness`` 0 (weights change only between steps)."""
    for e in engines:
        if e.version_source is None:
            raise StalenessError(
                f"engine {e.name} does not say which policy version sampled its tokens, so none of them "
                "can be trained on: use rstar2 serve, rstar2 vllm, or a server with SGLang's /get_weight_version"
            )
        if e.version_source == "stated" and max_staleness > 0:
            raise StalenessError(
                f"engine {e.name} states only the version it holds, not each token's: with "
                f"asynchronous.max_staleness={max_staleness} weights change while it samples; use "
                "max_staleness 0, or rstar2 serve / rstar2 vllm, whose tokens carry their versions"
            )


def require_adapter_slots(engines: Sequence[Engine], max_staleness: int) -> None:
    """Every engine that holds adapters by name (vLLM) must hold ``max_staleness + 1`` at once: a
    request names the newest adapter as it starts, and while it decodes at most k newer ones load
    (its group's step publishes only once the group has finished). With fewer, vLLM drops the adapter
    it decodes under and reads it again from a folder since written over (docs/adapters.md)."""
    for e in engines:
        slots = getattr(e, "adapter_slots", None)
        if slots is not None and slots < max_staleness + 1:
            raise StalenessError(
                f"engine {e.name} holds {slots} adapters at once: with asynchronous.max_staleness="
                f"{max_staleness} a request may decode under an adapter {max_staleness} updates older "
                f"than the newest, so it needs {max_staleness + 1}; start it with rstar2 vllm "
                f"--lora-slots {max_staleness + 1} (or more), or lower max_staleness"
                + (" (it was started without --lora-rank: it serves no adapter)" if not slots else "")
            )


class TrainerEngines:
    """The engines of one RL run and how they get its weights (``mode``)."""

    def __init__(self, cfg: RLConfig, world: D.World):
        """Made once ``model.threads`` is set: the update's thread starts with torch's default."""
        self.cfg, self.world = cfg, world
        self.threads = torch.get_num_threads()
        copies = world.distributed or cfg.asynchronous.off_policy
        self.mode: Mode = "servers" if cfg.rollout.engine.servers else "copy" if copies else "shared"
        self.engine_model: torch.nn.Module | None = None  # what an in-process engine decodes
        self.engines: list[Any] = []
        # servers: the folders a server loads in order to hold the last published version, and it
        self.published: tuple[list[Path], int] | None = None
        self._sending = asyncio.Lock()  # a publish and a revive, one at a time
        self.scheduler: Any = None  # servers: the rollout's (``attach``)
        cap = cfg.rollout.engine.weight_check_tol
        self.content = ContentCheck(cap) if cap is not None else None
        # servers found not to serve the weights they said they took, and the first version they
        # did not serve: none of their tokens of that version or later is trained (``untrue_turn``)
        self.untrue: dict[str, int] = {}

    def adopt(self, model: torch.nn.Module) -> None:
        """The trainer's full model, before it is sharded: shared, or copied in the engine's dtype."""
        if self.mode == "shared":
            self.engine_model = model
        elif self.mode == "copy":
            self.engine_model = copy.deepcopy(model).to(engine_dtype(self.world.device))

    async def open(self) -> list[Engine]:
        """Remote servers, or one in-process engine over the adopted model."""
        from ...engines.kinds import open_engines

        cfg = self.cfg
        self.engines = await open_engines(
            cfg.rollout.engine,
            trainer_model=self.engine_model,
            name=f"rank{self.world.rank}",
            compute=cfg.model.compute,
            keep_stale_kv=cfg.asynchronous.keep_stale_kv,
        )
        if cfg.model.lora is not None:  # refused before any load (the caller closes the engines)
            require_adapter_slots(self.engines, cfg.asynchronous.max_staleness)
        return self.engines

    def serving(self) -> list[Engine]:
        """The engines in rotation (every one where no scheduler says otherwise)."""
        return [e for e in self.engines if self.scheduler is None or self.scheduler.in_rotation(e)]

    def attach(self, scheduler: Any) -> None:
        """Servers: the rollout's scheduler says which are in rotation and takes out those that do
        not take the weights; rank 0's brings them back (``revive``: rank 0 writes the weights, so
        another rank could read a folder half written)."""
        if self.mode == "servers":
            self.scheduler = scheduler
            scheduler.revive = self.revive if self.world.main else None

    async def publish(
        self, model: torch.nn.Module, step: int, folder: Path, probe_prompt: list[int], pad_id: int
    ) -> dict[str, float]:
        """The trainer's weights as policy version ``step`` to the engines (those in rotation once the
        run has started), checked (``sync.publish``). A server that does not take them leaves the
        rotation, at the start too while others did (an engine node lost before a stage starts; with
        none left the run stops); it comes back only through ``revive``, which loads these weights."""
        async with self._sending:
            whole = self.published is None  # an adapter's base goes to the servers once a run
            rotation = self.scheduler
            started = self.published is not None and rotation is not None  # at the start: every one
            # rank 0 loads the servers in rotation on its scheduler; another rank probes those it names
            engines = [
                e for e in self.engines if not started or not self.world.main or rotation.in_rotation(e)
            ]

            def lost(engine: Any, why: str) -> None:
                rotation.fail(engine, f"it did not take the weights of version {step}: {why}")

            def untrue(engine: Any, why: str) -> None:
                self.untrue[engine.name] = step
                rotation.retire(engine, f"with the weights of version {step}: {why}")

            metrics = await publish(
                model,
                engines,
                self.cfg.rollout.engine,
                self.world,
                folder,
                in_place=self.mode == "shared",
                probe_prompt=probe_prompt,
                pad_id=pad_id,
                step=step,
                compute=self.cfg.model.compute,
                whole=whole,
                check=self.content,
                on_untrue=untrue if rotation is not None else None,
                on_lost=lost if rotation is not None else None,
            )
            self.published = (whole_parts(model, folder), step)
            return metrics

    async def revive(self, engine: Any) -> None:
        """A failed (or restarted) server loads the weights all hold, checked, before it serves again."""
        async with self._sending:
            if self.published is None:
                raise WeightSyncError(f"engine {engine.name}: no weights published yet")
            folders, version = self.published
            once = self.cfg.rollout.engine.model_copy(update={"reload_retries": 0})  # the scheduler retries
            for folder in folders:
                await load_into_servers([engine], folder, once, version=version)
            if engine.version_source is None:  # out since the start: never asked what it reports
                await engine.probe_capacity()
                require_reported_versions([engine], self.cfg.asynchronous.max_staleness)
            if self.scheduler is not None:  # in rotation before the next publish can pass it by
                self.scheduler.restore(engine)

    @contextmanager
    def beside_update(self) -> Iterator[None]:
        """While an update runs beside a decoding engine copy, ``asynchronous.engine_threads`` of the
        torch threads go to the engine, the rest to the update (each alone uses them all)."""
        total, share = self.threads, self.cfg.asynchronous.engine_threads
        split = self.mode == "copy" and self.cfg.asynchronous.off_policy and share and share < total
        if not split:
            yield
            return
        for e in self.engines:
            e.threads = share
        torch.set_num_threads(total - share)
        try:
            yield
        finally:
            torch.set_num_threads(total)
            for e in self.engines:
                e.threads = None

    async def counters(self) -> list[dict[str, Any] | None]:
        return [await e.counters() for e in self.engines]

    async def close(self) -> None:
        for e in self.engines:
            with quietly(f"closing engine {e.name}"):
                await e.close()

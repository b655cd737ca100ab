"""``toy://MODEL_DIR``: a user's own served engine kind, from outside rstar2. A model folder decoded
in this process, yet given new weights as a server is, from the folders the trainer writes: a
model's, or an adapter run's base and then its adapters. Each load is appended to the JSON Lines
file ``$TOY_ENGINE_LOADS`` (for the test)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from rstar2.adapters import is_adapter
from rstar2.engines.base import Generation, SamplingParams, WeightUpdate
from rstar2.engines.hf import HFEngine


class ToyEngine:
    local = False
    version_source = "tokens"
    prefix_cache = True

    @classmethod
    async def serves(cls, url: str) -> bool:
        return url.startswith("toy://")

    def __init__(
        self, url: str, *, capacity_tokens: int | None = None, timeout_s: float = 0, reload_path: str = ""
    ):
        self.name = url
        self.decoder = HFEngine.from_pretrained(
            url.removeprefix("toy://"), device="cpu", dtype="float32", capacity_tokens=capacity_tokens
        )
        self.capacity_tokens = self.decoder.capacity_tokens

    @property
    def in_flight(self) -> int:
        return self.decoder.in_flight

    async def probe_capacity(self) -> int:
        return self.capacity_tokens

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await self.decoder.generate(prompt_ids, params)

    async def load_weights(self, update: WeightUpdate) -> dict[str, Any]:
        from safetensors.torch import load_file

        if update.folder is None:
            raise ValueError(f"engine {self.name} loads a folder, not tensors")
        folder = Path(update.folder)
        if is_adapter(folder):
            await asyncio.to_thread(self.decoder.update_adapter, folder, update.version)
        else:
            tensors = {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}
            await asyncio.to_thread(self.decoder.update_weights, tensors, update.version)
        with open(os.environ["TOY_ENGINE_LOADS"], "a") as f:
            f.write(
                json.dumps({"folder": str(folder), "version": update.version, "adapter": is_adapter(folder)})
                + "\n"
            )
        return {"weights_version": update.version}

    async def counters(self) -> dict[str, Any] | None:
        return await self.decoder.counters()

    async def close(self) -> None:
        await self.decoder.close()


class ToyLocal(HFEngine):
    """An in-process kind of a user's own (``rollout.engine.kind: toy-local``): rstar2's own, renamed."""

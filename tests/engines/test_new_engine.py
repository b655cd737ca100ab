"""A new kind of engine is one file and one line in ``engines/kinds.py``'s table: ``ToyEngine``,
written here and nowhere else, is connected by its URL, samples an RL run's rollouts, takes each
version of the trainer's weights through ``load_weights`` and passes the trainer's checks (the
versions its tokens carry, the probe after each load) with no other change to rstar2."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from rstar2.config import DEFAULT_ROLLOUT
from rstar2.engines import kinds
from rstar2.engines.base import Engine, Generation, SamplingParams, WeightUpdate
from rstar2.engines.hf import HFEngine

from ..rl.test_async import _config, _train

LOADS: list[tuple[str, int]] = []  # (folder, version): what the trainer asked every ToyEngine to load


class ToyEngine:
    """``toy://MODEL_DIR``: a model folder decoded in this process, yet given new weights as a
    server is, from the folder the trainer writes (a stand-in for a user's own inference server)."""

    local = False
    version_source = "tokens"

    @classmethod
    async def serves(cls, url: str) -> bool:
        return url.startswith("toy://")

    def __init__(
        self,
        url: str,
        *,
        capacity_tokens: int | None = None,
        timeout_s: float = DEFAULT_ROLLOUT.engine.server_timeout_s,
        reload_path: str = "",
    ) -> None:
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

        assert update.folder is not None
        tensors = {
            k: v for f in sorted(Path(update.folder).glob("*.safetensors")) for k, v in load_file(f).items()
        }
        await asyncio.to_thread(self.decoder.update_weights, tensors, update.version)
        LOADS.append((str(update.folder), update.version))
        return {"weights_version": update.version}

    async def counters(self) -> dict[str, Any] | None:
        return await self.decoder.counters()

    async def close(self) -> None:
        await self.decoder.close()


@pytest.mark.slow
def test_an_engine_in_one_file_and_one_table_line_serves_an_rl_run(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(kinds, "SERVED", [f"{__name__}:ToyEngine", *kinds.SERVED])  # the one line
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    LOADS.clear()
    history = _train(_config(tiny_dir, tmp_path, "run", steps=2, servers=[f"toy://{tiny_dir}"]))
    assert isinstance(ToyEngine("toy://" + str(tiny_dir)), Engine)  # the contract's names, all there
    assert [v for _, v in LOADS] == [0, 1, 2]  # the run's start, then each update
    assert all(Path(folder).is_relative_to(tmp_path / "run") for folder, _ in LOADS)
    assert len(history) == 2
    # after each load it samples as the trainer does (the probe: its log-probs are the trainer's)
    assert all(m["sync/logprob_diff"] < 1e-4 for m in history)


async def test_an_engine_refuses_weights_in_a_form_it_does_not_take(tiny):
    """An in-process engine takes tensors, a server a folder: the other form is an error, never a
    version claimed for weights that were not loaded."""
    import copy

    from rstar2.engines.openai import OpenAIEngine
    from rstar2.engines.vllm import VLLMEngine

    local = HFEngine(copy.deepcopy(tiny[0]))
    with pytest.raises(ValueError, match="takes tensors, not a folder"):
        await local.load_weights(WeightUpdate(1, folder=Path("/runs/r/weights")))
    for served in (OpenAIEngine("http://127.0.0.1:9"), VLLMEngine("http://127.0.0.1:9")):
        with pytest.raises(ValueError, match="loads a folder, not tensors"):
            await served.load_weights(WeightUpdate(1, tensors={}))
        await served.close()
    assert local.version == 0
    await local.close()

"""The checks that an engine holds the trainer's weights (``rl/run/sync.py``): sensitive enough that one
update at the smallest learning rate a shipped recipe uses cannot pass unnoticed."""

from __future__ import annotations

import copy

import pytest
import torch

from rstar2.engines.base import weights_fingerprint
from rstar2.rl.run.sync import WeightSyncError, check_fingerprint

SMALLEST_LR = 1e-6  # recipes/qwen3-14b.yaml's RL stages (the paper's)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_server_that_missed_one_update_at_the_smallest_learning_rate_is_caught(tiny, dtype):
    """The server states the fingerprint of what it holds, computed in its own dtype; the trainer
    compares it with the weights it sent. One AdamW step at lr 1e-6 moves every weight by ~1e-6:
    a server still on the weights before it fails the check (a sampled probe of 16 tokens, 0.1
    nats, cannot see this). In bf16 the step is what survives the rounding of each weight, which is
    exactly what such a server could hold."""
    model = copy.deepcopy(tiny[0])
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optim = torch.optim.AdamW(model.parameters(), lr=SMALLEST_LR)
    ids = torch.tensor([list(range(5, 40))])
    model(input_ids=ids, labels=ids).loss.backward()
    optim.step()
    after = {k: v.detach().clone() for k, v in model.state_dict().items()}
    cast = getattr(torch, dtype)
    if all(torch.equal(before[k].to(cast), after[k].to(cast)) for k in after):
        pytest.fail("the update moved no weight at this dtype: nothing to detect")
    stale = {"weights_fingerprint": weights_fingerprint(before, dtype), "dtype": dtype}
    with pytest.raises(WeightSyncError, match="holds other weights than the trainer sent"):
        check_fingerprint("http://srv:8000", stale, after)
    check_fingerprint(
        "http://srv:8000", {"weights_fingerprint": weights_fingerprint(after, dtype), "dtype": dtype}, after
    )


class _Server:
    """The client side of a server's weight load (``OpenAIEngine.load_weights``), answering as
    ``rstar2 serve`` does, or refusing."""

    local = False

    def __init__(self, name: str, refuses: bool = False):
        self.name, self.refuses, self.loads = name, refuses, []

    async def load_weights(self, update):
        self.loads.append(update.version)
        if self.refuses:
            raise RuntimeError("answered 500: out of memory")
        return {"weights_version": update.version}


async def test_a_push_that_one_server_refuses_stops_the_run_naming_it(tmp_path):
    """All servers are told at once; when one does not take the weights (after its retries) the
    error names it and the version, so the run stops before training on tokens from servers on
    different versions. A server that states another version than the one sent is refused too."""
    from rstar2.config import EngineSection
    from rstar2.rl.run.sync import load_into_servers

    settings = EngineSection(reload_retries=0)
    good, bad = _Server("http://a:1"), _Server("http://b:2", refuses=True)
    with pytest.raises(
        WeightSyncError, match=r"1 of 2 engines did not take the weights of version 4.*http://b:2"
    ):
        await load_into_servers([bad, good], tmp_path, settings, version=4)
    assert good.loads == [4] and bad.loads == [4]  # both asked at once: the refusal stopped no other

    class _Behind(_Server):
        async def load_weights(self, update):
            return {"weights_version": update.version - 1}

    with pytest.raises(WeightSyncError, match="says it holds version 3, not 4"):
        await load_into_servers([_Behind("http://c:3")], tmp_path, settings, version=4)


async def test_a_server_that_takes_the_weights_then_fails_the_probe_leaves_the_rotation(tiny, tmp_path):
    """Mid-run (``on_lost``) a server that loaded the weights but does not answer the probe after
    is handed over to leave the rotation, and the step goes on with the others; at the run's start
    (no ``on_lost``), or with none left, the step stops naming it."""
    from rstar2.config import EngineSection
    from rstar2.engines.base import Generation
    from rstar2.rl.run import distributed as D
    from rstar2.rl.run.sync import publish

    class _Answering(_Server):
        def __init__(self, name, answers=True):
            super().__init__(name)
            self.answers = answers

        async def generate(self, prompt, params):
            if not self.answers:
                raise ConnectionError("connection refused")
            return Generation([5, 6], [-1.0, -1.0], "length", [0, 0])

    model = tiny[0]
    settings = EngineSection(reload_retries=0, weight_check_tol=None)
    good, gone = _Answering("http://a:1"), _Answering("http://b:2", answers=False)
    lost: list[tuple[str, str]] = []
    kw = dict(probe_prompt=[3, 4], pad_id=0, step=2)
    out = await publish(
        model,
        [good, gone],
        settings,
        D.World(),
        tmp_path / "w",
        in_place=False,
        **kw,
        on_lost=lambda e, why: lost.append((e.name, why)),
    )
    assert good.loads == gone.loads == [2] and "sync/logprob_diff" in out
    assert lost == [
        ("http://b:2", "engine http://b:2 did not answer the probe: ConnectionError: connection refused")
    ]
    with pytest.raises(WeightSyncError, match="engine http://b:2 did not answer the probe"):
        await publish(model, [good, gone], settings, D.World(), tmp_path / "w", in_place=False, **kw)
    with pytest.raises(WeightSyncError, match="engine http://b:2 did not answer the probe"):
        await publish(model, [gone], settings, D.World(), tmp_path / "w", in_place=False, **kw, on_lost=print)

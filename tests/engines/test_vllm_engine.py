"""``VLLMEngine``'s requests and answers, by hand (a real vLLM runs in tests/test_vllm.py)."""

from __future__ import annotations

import pytest

from rstar2.engines.base import SamplingParams
from rstar2.engines.openai import ServerError
from rstar2.engines.vllm import VLLMEngine, token_versions


def test_weight_version_spans_become_one_version_a_token():
    spans = [{"version": "default", "start": 0, "end": 2}, {"version": "3", "start": 2, "end": 5}]
    assert token_versions(spans, 5) == [-1, -1, 3, 3, 3]
    assert token_versions([{"version": "4", "start": 0, "end": 9}], 3) == [4, 4, 4]  # clipped
    assert token_versions(None, 3) is None


def test_a_request_carries_what_the_rollout_asks_and_a_cpu_server_gets_no_seed():
    engine = VLLMEngine("http://vllm:8000")
    params = SamplingParams(max_new_tokens=5, temperature=0.7, stop_token_ids=(2,), seed=11)
    params.banned_token_ids, params.priority = (7, 9), -3
    body = engine.body([1, 2, 3], params, "m")
    sampling = body["sampling_params"]
    assert body["token_ids"] == [1, 2, 3] and sampling["seed"] == 11 and "priority" not in body
    assert sampling["logit_bias"] == {"7": -100, "9": -100} and sampling["stop_token_ids"] == [2]
    assert sampling["ignore_eos"] is True and sampling["top_k"] == -1 and sampling["logprobs"] == 0
    engine.send_seed, engine.send_priority = False, True
    body = engine.body([1], params, "m")
    assert "seed" not in body["sampling_params"] and body["priority"] == -3


def test_an_answer_without_a_log_prob_a_token_or_that_was_aborted_is_an_error():
    engine = VLLMEngine("http://vllm:8000")
    good = {
        "token_ids": [4, 5],
        "finish_reason": "length",
        "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -2.0}]},
        "weight_versions": [{"version": "1", "start": 0, "end": 2}],
    }
    gen = engine.parse(good)
    assert gen.token_ids == [4, 5] and gen.logprobs == [-1.0, -2.0] and gen.versions == [1, 1]
    with pytest.raises(ServerError, match="1 log-probs for 2 tokens"):
        engine.parse({**good, "logprobs": {"content": [{"logprob": -1.0}]}})
    with pytest.raises(ServerError, match="abort"):
        engine.parse({**good, "finish_reason": "abort"})

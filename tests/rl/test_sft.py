"""SFT: conversations tokenized turn by turn as rollouts build them, loss on assistant tokens only."""

from __future__ import annotations

import json

import pytest
import torch

from rstar2.chat.format import ChatFormat
from rstar2.config_files import parse_config
from rstar2.rl.sft import SFTTrainer, read_conversations, sft_batch

CALL = '<tool_call>{"name": "execute_python_code_with_standard_io", "arguments": {"code": "print(6*7)"}}</tool_call>'


def conversation(a: int, b: int) -> list[dict]:
    return [
        {"role": "user", "content": f"What is {a} * {b}?"},
        {"role": "assistant", "content": CALL.replace("6*7", f"{a}*{b}")},
        {"role": "tool", "content": str(a * b)},
        {"role": "assistant", "content": f"<answer>\\boxed{{{a * b}}}</answer>"},
    ]


def test_conversation_ids_mask_exactly_the_assistant_turns(tiny):
    fmt = ChatFormat(tiny[1], system_prompt="Answer.")
    msgs = conversation(6, 7)
    ids, mask = fmt.conversation_ids(msgs)
    assert len(ids) == len(mask)
    # the ids decode to what the chat template renders (up to the closing glue after the last turn)
    full = fmt.render([{"role": "system", "content": "Answer."}, *msgs])
    assert full.startswith(fmt.decode(ids)) and full[len(fmt.decode(ids)) :] == "\n"
    learned = fmt.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert learned == msgs[1]["content"] + "<|im_end|>" + msgs[3]["content"] + "<|im_end|>"
    # the prompt part is the rollout's prompt, token for token
    prompt = fmt.encode(fmt.render([{"role": "system", "content": "Answer."}, msgs[0]], True))
    assert ids[: len(prompt)] == prompt and not any(mask[: len(prompt)])
    # the tool turn is the rollout's tool turn, token for token
    start = len(prompt) + mask[len(prompt) :].index(0)
    tool = fmt.tool_turn_ids(["42"], model_end="<|im_end|>")
    assert ids[start : start + len(tool)] == tool


def test_conversations_without_assistant_or_bad_lines_are_refused(tiny, tmp_path):
    fmt = ChatFormat(tiny[1])
    with pytest.raises(ValueError, match="no assistant"):
        fmt.conversation_ids([{"role": "user", "content": "hi"}])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_conversations(bad)


def test_sft_batch_weights_are_a_token_mean_over_assistant_tokens():
    b = sft_batch([([1, 2, 3, 4], [0, 0, 1, 1]), ([1, 5], [0, 1])], pad_id=0)
    assert b.mask.tolist() == [[0, 1, 1], [1, 0, 0]]
    assert torch.allclose(b.weights, b.mask / 3)


def sft_run(model_dir, tmp_path, *, epochs: int, lr: float, **model) -> list[dict]:
    """SFT on 16 products for ``epochs`` (8 a step) into ``tmp_path/run``; its history."""
    data = tmp_path / "sft.jsonl"
    data.write_text(
        "".join(json.dumps({"messages": conversation(a, b)}) + "\n" for a in range(2, 6) for b in range(3, 7))
    )
    cfg = parse_config(
        {
            "kind": "sft",
            "chat": {"system_prompt": "Answer.", "tools_in_prompt": False},
            "model": {"path": str(model_dir), "threads": 1, **model},
            "data": {"train": str(data)},
            "sft": {"epochs": epochs},
            "optim": {"lr": lr, "warmup_steps": 2},
            "run": {"out": str(tmp_path / "run"), "batch_size": 8, "save_every": 100, "progress": False},
        }
    )
    threads = torch.get_num_threads()
    try:
        return SFTTrainer(cfg).train()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_sft_learns_the_format_and_saves_a_loadable_checkpoint(tiny_dir, tmp_path):
    history = sft_run(tiny_dir, tmp_path, epochs=4, lr=1e-2)
    assert len(history) == 8  # 4 epochs of 16 examples at 8 per step
    # the loss starts near ln 512 = 6.2 (random weights) and must fall by more than 30%
    assert history[-1]["loss"] < 0.7 * history[0]["loss"], [h["loss"] for h in history]
    from transformers import AutoModelForCausalLM

    ckpt = tmp_path / "run" / "checkpoints" / "step-000008"
    AutoModelForCausalLM.from_pretrained(ckpt)
    state = json.loads((ckpt / "state.json").read_text())
    assert state["step"] == 8 and state["data_position"] == 64


@pytest.mark.slow
def test_stop_skill_stops_at_the_first_probe_that_reaches_it_and_logs_the_exact_probability(
    tiny_dir, tmp_path
):
    """``probe/exact`` is the mean over probe conversations of exp(sum of the assistant tokens'
    log-probs), recomputed here on the saved checkpoint by a plain forward pass; a run measures it
    every ``probe_every`` steps and stops at the first measure that reaches ``stop_skill``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data, probe = tmp_path / "sft.jsonl", tmp_path / "probe.jsonl"
    data.write_text(
        "".join(json.dumps({"messages": conversation(a, b)}) + "\n" for a in range(2, 6) for b in range(3, 7))
    )
    probe.write_text("".join(json.dumps({"messages": conversation(a, 3)}) + "\n" for a in (2, 3, 4)))

    def run(name: str, **sft) -> tuple[SFTTrainer, list[dict]]:
        cfg = parse_config(
            {
                "kind": "sft",
                "chat": {"system_prompt": "Answer.", "tools_in_prompt": False},
                "model": {"path": str(tiny_dir), "threads": 1, "compute": "fp32"},
                "data": {"train": str(data)},
                "sft": {"probe": str(probe), **sft},
                "optim": {"lr": 1e-2, "warmup_steps": 2},
                "run": {
                    "out": str(tmp_path / name),
                    "batch_size": 8,
                    "steps": 12,
                    "save_every": 100,
                    "progress": False,
                },
            }
        )
        threads = torch.get_num_threads()
        try:
            trainer = SFTTrainer(cfg)
            return trainer, trainer.train()
        finally:
            torch.set_num_threads(threads)

    whole, history = run("whole", probe_every=1)
    chance = [h["probe/exact"] for h in history]
    assert not whole.stopped_early and len(chance) == 12 and chance[-1] > 1e6 * chance[1] > 0, chance
    ckpt = tmp_path / "whole" / "checkpoints" / "step-000012"
    model, tok = AutoModelForCausalLM.from_pretrained(ckpt), AutoTokenizer.from_pretrained(ckpt)
    fmt = ChatFormat.from_settings(tok, whole.cfg.chat)
    by_hand = []
    with torch.no_grad():
        for msgs in read_conversations(probe):
            ids, mask = fmt.conversation_ids(msgs)
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
            picked = logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
            by_hand.append(float((picked * torch.tensor(mask[1:], dtype=torch.float)).sum().exp()))
    assert chance[-1] == pytest.approx(sum(by_hand) / len(by_hand), rel=1e-3, abs=0)

    # the same run measured every 3 steps, told to stop at the skill it had after 9: it stops at
    # the first measured step whose skill reaches that (the runs are deterministic)
    goal = chance[8]
    expected = next(s for s in (3, 6, 9) if chance[s - 1] >= goal)
    stopped, history = run("stopped", probe_every=3, stop_skill=goal)
    assert stopped.stopped_early and len(history) == expected
    assert ["probe/exact" in h for h in history] == [s % 3 == 0 for s in range(1, expected + 1)]
    assert (tmp_path / "stopped" / "checkpoints" / f"step-{expected:06d}").is_dir()

    with pytest.raises(ValueError, match="sft.probe"):
        parse_config(
            {"kind": "sft", "model": {"path": "m"}, "data": {"train": "t"}, "sft": {"stop_skill": 0.5}}
        )

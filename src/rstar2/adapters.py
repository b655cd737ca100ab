"""Low-rank adapters (PEFT's LoRA) on a Hugging Face causal LM: attached for training, saved as an
adapter folder (``adapter_model.safetensors`` + ``adapter_config.json`` naming its base model, the
layout PEFT and Hugging Face load), and merged into the base weights for decoding and export.

The adapter is injected into the model itself (``peft.inject_adapter_in_model``), not wrapped in a
``PeftModel``: the model keeps its class, ``generate`` and every pass rstar2 runs on it, and only
the adapter's parameters require gradients. ``load_model`` is the one way rstar2 loads a model
folder, so an adapter checkpoint goes wherever a model folder goes (the next stage, an evaluation,
an engine, the reference of the KL)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .auth import follow_umask
from .config import DEFAULT_RUN, LoraSection

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def is_adapter(path: str | Path) -> bool:
    """A folder holding an adapter (and no full model)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapted(model: torch.nn.Module) -> bool:
    """A model carrying an adapter (``attach``)."""
    return bool(getattr(model, "peft_config", None))


def base_of(path: str | Path) -> str:
    """The model folder an adapter checkpoint was trained on (its ``base_model_name_or_path``)."""
    config = json.loads((Path(path) / ADAPTER_CONFIG).read_text())
    base = config.get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise FileNotFoundError(
            f"the adapter in {path} names its base model {base!r}, which is not a folder here: "
            "put the base model back at that path (or edit adapter_config.json to point at it)"
        )
    return base


def _peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise ImportError("model.lora and adapter checkpoints need PEFT: pip install 'rstar2[lora]'") from exc
    return peft


def attach(
    model: torch.nn.Module, lora: LoraSection, base: str | Path, seed: int = DEFAULT_RUN.seed
) -> torch.nn.Module:
    """A new adapter on ``model`` (loaded from the folder ``base``): the base weights frozen, the
    adapter's B zero (PEFT's initialisation), so the model computes exactly what it did. Its random
    A comes from ``seed`` alone (the global generator untouched), so ``rstar2 replay`` draws it again."""
    peft = _peft()
    config = peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=lora.targets,
        lora_dropout=lora.dropout,
        base_model_name_or_path=str(Path(base).resolve()),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return peft.inject_adapter_in_model(config, model)


def adapter_weights(
    model: torch.nn.Module, state: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """The adapter's tensors under PEFT's saved names (from ``state``: a full state dict of ``model``
    gathered elsewhere, e.g. over FSDP's shards)."""
    return _peft().get_peft_model_state_dict(model, state_dict=state)


def save_adapter(
    model: torch.nn.Module, folder: str | Path, state: dict[str, torch.Tensor] | None = None
) -> Path:
    """``folder`` gains the adapter's weights and config (nothing of the base model)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().to("cpu").contiguous() for k, v in adapter_weights(model, state).items()}
    save_file(weights, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    model.peft_config["default"].save_pretrained(str(folder))
    return folder


def load_model(
    path: str | Path, dtype: Any = None, lora: LoraSection | None = None, seed: int = DEFAULT_RUN.seed
) -> torch.nn.Module:
    """The causal LM at ``path``: a model folder, or an adapter checkpoint (its base with the adapter).
    With ``lora`` the model trains an adapter: the one in ``path`` continued (same rank and alpha),
    else a new one (drawn from ``seed``). Without, a plain model (an adapter checkpoint's merged)."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not is_adapter(path):
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        return attach(model, lora, path, seed) if lora is not None else model
    saved = _peft().LoraConfig.from_pretrained(str(path))
    if lora is not None and (saved.r, float(saved.lora_alpha)) != (lora.rank, float(lora.alpha)):
        raise ValueError(
            f"{path} holds an adapter of rank {saved.r}, alpha {saved.lora_alpha}; model.lora asks for "
            f"rank {lora.rank}, alpha {lora.alpha}: train on with the same settings, or merge it first "
            f"(rstar2 model merge {path} --out DIR) and start a new adapter on the merged model"
        )
    model = AutoModelForCausalLM.from_pretrained(base_of(path), dtype=dtype)
    load_adapter_into(model, path, lora)
    return model if lora is not None else unload(model, merged=True)


def base_names(model: torch.nn.Module) -> dict[str, str]:
    """The model's tensors without its adapter: the name each has in a model never adapted (PEFT's
    ``.base_layer`` dropped) → its name here. A served engine loads a base model's folder by it."""
    return {k.replace(".base_layer", ""): k for k in model.state_dict() if ".lora_" not in k}


def base_weights(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (the adapted model's full state dict, tied copies left out) without the adapter,
    under the base's names."""
    return {plain: state[own] for plain, own in base_names(model).items() if own in state}


def load_adapter_into(model: torch.nn.Module, folder: str | Path, trained: LoraSection | None = None) -> int:
    """``model`` takes the adapter in ``folder`` (injected on the first load, its tensors replaced on
    later ones: an engine's); names, shapes and rank are checked before anything is written (a
    ``ValueError`` then). ``trained``: the adapter trains on, with its dropout. How many tensors."""
    peft, folder = _peft(), Path(folder)
    config = peft.LoraConfig.from_pretrained(str(folder))
    tensors = load_file(str(folder / ADAPTER_WEIGHTS))
    if adapted(model):
        held = model.peft_config["default"]
        if (held.r, float(held.lora_alpha)) != (config.r, float(config.lora_alpha)):
            raise ValueError(
                f"{folder}: an adapter of rank {config.r}, alpha {config.lora_alpha}; the engine holds "
                f"rank {held.r}, alpha {held.lora_alpha} (restart it to change adapters)"
            )
    else:
        config.inference_mode = trained is None
        config.lora_dropout = trained.dropout if trained is not None else config.lora_dropout
        peft.inject_adapter_in_model(config, model)
    want = {k: tuple(v.shape) for k, v in adapter_weights(model).items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if want != got:
        odd = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
        raise ValueError(f"{folder}: adapter tensors that do not fit the model: {odd[:5]} ({len(odd)})")
    peft.set_peft_model_state_dict(model, tensors)  # copied into the adapter's own tensors, their dtype
    return len(tensors)


class BaseOf(torch.nn.Module):
    """An adapted model computing as its base: each adapted layer's adapter off for the call. The
    KL's reference where the adapter began at the stage's start, without a copy of the weights."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self._adapted = [model]  # not a submodule: its parameters are the policy's, trained elsewhere

    def forward(self, **inputs: Any) -> Any:
        from peft.tuners.tuners_utils import BaseTunerLayer

        model = self._adapted[0]
        layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
        for layer in layers:
            layer.enable_adapters(False)
        try:
            return model(**inputs)
        finally:
            for layer in layers:
                layer.enable_adapters(True)


def base_reference(policy: torch.nn.Module, start: str | Path) -> BaseOf | None:
    """The KL's reference without a copy where it can be: ``policy``'s base, when its adapter is
    new since ``start`` (a model folder, not an adapter checkpoint); else None (load ``start``)."""
    return BaseOf(policy) if adapted(policy) and not is_adapter(start) else None


def unload(model: torch.nn.Module, merged: bool = False) -> torch.nn.Module:
    """The adapter removed (in place): a plain model, decoding as fast as one never adapted;
    ``merged``: added into the base weights first, computing what the adapted one did (to float rounding)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            if merged:
                module.merge()
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, module.get_base_layer())
    if hasattr(model, "peft_config"):
        del model.peft_config
    return model


def merge_folder(source: str | Path, out: str | Path) -> Path:
    """``rstar2 model merge``: an adapter checkpoint (or a run: its last checkpoint) written as one
    Hugging Face model folder, with its tokenizer, that any engine loads. Merged and written in
    fp32 whatever the base's precision: added into bf16 weights, an update smaller than bf16's
    spacing is rounded away. Written to a temporary folder first: a failed merge leaves no
    half-written one."""
    from transformers import AutoTokenizer

    source, out = Path(source), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out}: {'a file' if not out.is_dir() else 'not empty'}; give a new folder")
    if not is_adapter(source):
        raise ValueError(f"{source} holds no adapter ({ADAPTER_CONFIG}): it is already a whole model")
    model = load_model(source, dtype=torch.float32)
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        model.save_pretrained(str(partial))
        AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(partial))
        follow_umask(partial)  # safetensors writes 0o600; this folder is for other tools, other users
        if out.exists():
            out.rmdir()
        partial.replace(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out

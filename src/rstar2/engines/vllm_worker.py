"""What rstar2 adds to vLLM's workers (``--worker-extension-cls``): an in-place load of the trainer's
model folder (under ``rstar2 vllm --weights-from``) that says whether every parameter was written.
It runs inside vLLM's process, so it imports nothing of rstar2 but this file and ``rstar2.auth``.
Not ``reload_weights`` alone: on a CPU vLLM computes with a packed copy of each linear layer's
weight, and a tied LM head (no weights of its own on a reload) would keep the start's weights; such
copies are made again from the weights now held."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..auth import WEIGHTS_FROM_ENV, FolderRefused, allowed_folder, opened_folder


def zero_tensors(folder: str) -> int:
    from safetensors import safe_open

    count = 0
    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as fh:
            count += sum(not fh.get_tensor(k).any() for k in fh.keys())
    return count


SHAPES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
SHAPES += ("intermediate_size", "vocab_size", "head_dim")


class OtherShapes(ValueError):
    """A folder of a model of other sizes than the one served: refused before anything is written."""


def refuse_other_shapes(folder: str, served: Any) -> None:
    """A folder whose model has other sizes than the served one is refused before anything is
    written (vLLM's loaders would fail half way, leaving the server unable to serve)."""
    theirs = json.loads((Path(folder) / "config.json").read_text())
    other = {
        key: (theirs[key], getattr(served, key))
        for key in SHAPES
        if key in theirs and theirs[key] is not None and getattr(served, key, None) not in (None, theirs[key])
    }
    if other:
        raise OtherShapes(
            f"{folder} holds a model of other sizes than the one served (folder, served): {other}; "
            "nothing was loaded"
        )


class WorkerExtension:
    """Mixed into vLLM's worker class; its methods are called through ``/collective_rpc``."""

    def rstar2_load(self, folder: str) -> dict[str, Any]:
        """Load ``folder`` in place and say what was not written: ``missing`` (not reported loaded
        by vLLM's loader), ``unwritten`` (still zero though every parameter was zeroed first: a
        check independent of that accounting), ``zero_in_folder``, ``parameters`` loaded. A failure
        is answered as ``error``, never raised: it would shut the whole vLLM server down; one made
        before anything was written says the ``status`` a server would (403: the folder, 400: the
        sizes), so that the trainer does not ask again. The files read are those checked: each
        opened once and checked open (``auth.opened_folder``)."""
        try:
            roots = [Path(p) for p in os.environ.get(WEIGHTS_FROM_ENV, "").split(os.pathsep) if p]
            real = allowed_folder(folder, roots)
            with opened_folder(real, roots) as private:
                return self._rstar2_load(str(real), str(private))
        except (FolderRefused, OtherShapes) as exc:
            return {
                "error": f"{type(exc).__name__}: {exc}",
                "status": 403 if isinstance(exc, FolderRefused) else 400,
            }
        except Exception as exc:  # noqa: BLE001 - said to the client, which refuses the load
            return {"error": f"{type(exc).__name__}: {exc}"}

    def _rstar2_load(self, folder: str, private: str) -> dict[str, Any]:
        import torch

        refuse_other_shapes(private, self.model_runner.model_config.hf_config)  # type: ignore[attr-defined]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        held = [(name, p) for name, p in model.named_parameters() if p.numel() > 0]
        with torch.no_grad():
            for _, p in held:
                p.zero_()
        loaded: set[str] = set()
        load = model.load_weights

        def recording(weights: Any) -> Any:
            got = load(weights)
            loaded.update(got or ())
            return got

        model.load_weights = recording  # this instance only, for this reload
        try:
            self.model_runner.reload_weights(weights_path=private)  # type: ignore[attr-defined]
        finally:
            del model.load_weights
            # the folder loaded, not its private stand-in (gone once the load is over)
            self.model_runner.model_config.model = folder  # type: ignore[attr-defined]
        _remake_cpu_copies(model)
        # served with --enable-lora, a linear layer's own weight sits in its wrapper's base_layer
        expected = {name.replace(".base_layer", "") for name, _ in model.named_parameters()}
        unwritten = [name for name, p in held if not bool(p.any())]
        written = len(expected & loaded)
        print(f"[rstar2] loaded {folder}: {written} parameters", flush=True)  # the server's log
        return {
            "missing": sorted(expected - loaded),
            "unwritten": unwritten,
            "zero_in_folder": zero_tensors(private) if unwritten else 0,  # the folder read again only then
            "parameters": written,
        }


def _remake_cpu_copies(model: Any) -> None:
    """Make again, from the weight each holds, the packed copy that a CPU layer computes with."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and weight is not None and weight.ndim == 2 and weight.numel():
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)

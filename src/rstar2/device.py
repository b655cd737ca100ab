"""Where a model runs and in what precision, decided once for the engine, trainers and analysis.

bf16 autocast pays only where the hardware multiplies in bf16 (a CUDA GPU with bf16, a CPU with
AVX512-BF16 or AMX); elsewhere oneDNN emulates it, many times slower than fp32. So ``auto`` is bf16
only where native, and an explicit ``bf16`` elsewhere is warned about once. ``ONEDNN_MAX_CPU_ISA``
(or ``DNNL_MAX_CPU_ISA``) below ``AVX512_CORE_BF16`` and ``ATEN_CPU_CAPABILITY`` below ``avx512`` are
honoured: either makes bf16 count as not native."""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch

COMPUTES = ("auto", "bf16", "fp32")

# oneDNN's instruction-set ceilings (ONEDNN_MAX_CPU_ISA) at which it computes bf16 natively
_ONEDNN_BF16_ISAS = frozenset(
    "AVX512_CORE_BF16 AVX512_CORE_FP16 AVX512_CORE_AMX AVX512_CORE_AMX_FP16 AVX10_1_512 "
    "AVX10_1_512_AMX AVX10_1_512_AMX_FP16 AVX10_2_512 AVX10_2_512_AMX_2 ALL DEFAULT".split()
)


class PrecisionWarning(UserWarning):
    """bf16 asked for where the hardware only emulates it."""


def pick_device(device: str = "auto") -> torch.device:
    """``auto``: CUDA when present, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def max_positions(model: Any) -> int:
    """The longest sequence the model's position embeddings take."""
    return int(getattr(model.config, "max_position_embeddings", 1 << 30))


def cpu_capability() -> str:
    """torch's name for the CPU's vector instructions (``AVX2``, ``AVX512``...); honours ``ATEN_CPU_CAPABILITY``."""
    return torch.backends.cpu.get_cpu_capability()


def _cpu_has(flag: str) -> bool:
    """A CPU feature as torch's cpuinfo sees it (``avx512_bf16``, ``amx_bf16``); unknown = absent."""
    caps = getattr(torch.cpu, "get_capabilities", None)  # torch >= 2.10; older: the private probes
    if caps is not None:
        return bool(caps().get(flag, False))
    probe = getattr(torch.cpu, {"avx512_bf16": "_is_avx512_bf16_supported"}.get(flag, ""), None)
    return bool(probe()) if probe is not None else False


def native_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` computes bf16 natively, and why in words (for the start-up line)."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False, "no CUDA device"
        name = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return True, f"{name} with bf16"
        return False, f"{name} without bf16"
    if device.type != "cpu":
        return False, f"{device.type}: bf16 not measured there"
    capability = cpu_capability()
    if _cpu_has("amx_bf16"):
        hardware = "AMX"
    elif _cpu_has("avx512_bf16"):
        hardware = "AVX512-BF16"
    else:
        return False, f"CPU {capability}, no AVX512-BF16 or AMX"
    isa = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    if isa and isa not in _ONEDNN_BF16_ISAS:
        return False, f"CPU {capability} with {hardware}, limited by ONEDNN_MAX_CPU_ISA={isa}"
    if not capability.upper().startswith(("AVX512", "AMX")):
        return False, f"CPU {capability} with {hardware}, limited by ATEN_CPU_CAPABILITY"
    return True, f"CPU {capability} with {hardware}"


@dataclass(frozen=True)
class Precision:
    """What ``model.compute`` asked and what the passes compute in on this device."""

    asked: str  # auto | bf16 | fp32
    resolved: str  # bf16 | fp32
    device: str
    why: str  # the hardware, in words

    def describe(self) -> str:
        how = "bf16 autocast" if self.resolved == "bf16" else "fp32"
        return f"{how} (model.compute: {self.asked}; {self.device}, {self.why})"


_warned: set[tuple[str, str]] = set()


def resolve_precision(device: torch.device | str, compute: str = "auto") -> Precision:
    """``auto``: bf16 where ``device`` computes it natively, fp32 elsewhere. ``bf16``: bf16 autocast
    even so (warned once per process where it is emulated). ``fp32``: never autocast."""
    if compute not in COMPUTES:
        raise ValueError(f"model.compute must be auto, bf16 or fp32, not {compute!r}")
    device = torch.device(device)
    if compute == "fp32":
        return Precision("fp32", "fp32", str(device), "asked for")
    native, why = native_bf16(device)
    if compute == "auto":
        return Precision("auto", "bf16" if native else "fp32", str(device), why)
    if not native and (str(device), why) not in _warned:
        _warned.add((str(device), why))
        warnings.warn(  # the figure: benchmarks/RESULTS.md
            f"model.compute is bf16, but this machine has no native bf16 ({device}: {why}), so every "
            "bf16 matrix product is emulated: measured 73x slower than fp32 on an AVX2-only CPU. Set "
            "model.compute: auto (fp32 here, bf16 where the hardware computes it).",
            PrecisionWarning,
            stacklevel=2,
        )
    return Precision("bf16", "bf16", str(device), why)


def record(precision: Precision) -> str:
    """The resolved precision as the first line of a run's ``config.yaml`` or ``recipe.yaml``: a YAML
    comment, so the file still loads as the config it records."""
    return f"# model.compute resolved on this machine: {precision.describe()}\n"


def compute_precision(device: torch.device | str, compute: str = "auto") -> contextlib.AbstractContextManager:
    """The context the passes run under: bf16 autocast where ``resolve_precision`` says bf16."""
    device = torch.device(device)
    bf16 = resolve_precision(device, compute).resolved == "bf16"
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def engine_dtype(device: torch.device | str, dtype: str = "auto") -> torch.dtype:
    """An inference engine's weights' dtype (``--dtype``): ``auto`` is bf16 on a GPU that computes it,
    else fp32 (a CPU's decode step is slower in bf16); else the dtype named."""
    device = torch.device(device)
    if dtype != "auto":
        return getattr(torch, dtype)
    return torch.bfloat16 if device.type == "cuda" and native_bf16(device)[0] else torch.float32


def decode_compute(device: torch.device | str, compute: str = "auto") -> str:
    """The in-process engine's ``model.compute``: the trainer's on a GPU, fp32 on a CPU (a decode
    step's small products are slower in bf16 autocast even on AVX512-BF16)."""
    return "fp32" if torch.device(device).type == "cpu" else compute

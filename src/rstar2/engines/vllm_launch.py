"""``rstar2 vllm``: start a vLLM server the way rstar2's RL needs it.

vLLM lives in a virtual environment of its own (``scripts/setup-vllm.sh``: it pins another
transformers than rstar2's), so the server runs under that environment's Python:
``--python``, else ``$RSTAR2_VLLM_PYTHON``, else ``.venv-vllm`` at the repository root, else this
Python. What rstar2 needs from it:

- ``VLLM_SERVER_DEV_MODE=1`` and ``--enable-scale-out``: the weight routes (pause, reload, version,
  resume), ``/server_info``, and the token-in, token-out ``/inference/v1/generate`` that states each
  token's weight version;
- ``--worker-extension-cls`` rstar2's (``engines/vllm_worker.py``, put on the server's path): the in
  place load that says what it did not write;
- ``--logprobs-mode processed_logprobs``: the log-probs of the distribution sampled from (after
  temperature and the banned tokens' bias), what the trainer corrects by;
- ``--scheduling-policy priority``: a trajectory's next turn before new ones (``SamplingParams``);
- on a CPU, the cores its engine is bound to (``VLLM_CPU_OMP_THREADS_BIND``) and its KV cache in GiB
  (``VLLM_CPU_KVCACHE_SPACE``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import rstar2

SRC = Path(rstar2.__file__).resolve().parents[1]  # the folder holding the rstar2 package
EXTENSION = "rstar2.engines.vllm_worker.WorkerExtension"
ENTRY = "vllm.entrypoints.launchers.api_server.entry"  # `vllm serve` without its console script


def vllm_python(given: str | None = None) -> str:
    """The Python of the environment vLLM is installed in."""
    if given:
        return given
    if os.environ.get("RSTAR2_VLLM_PYTHON"):
        return os.environ["RSTAR2_VLLM_PYTHON"]
    local = SRC.parent / ".venv-vllm" / "bin" / "python"
    return str(local) if local.exists() else sys.executable


def command(
    model: str,
    *,
    python: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    dtype: str = "auto",
    max_model_len: int | None = None,
    eager: bool = False,
    extra: tuple[str, ...] = (),
) -> list[str]:
    args = [python, "-m", ENTRY, "--model", model, "--host", host, "--port", str(port), "--dtype", dtype]
    args += ["--enable-scale-out", "--worker-extension-cls", EXTENSION]
    args += ["--logprobs-mode", "processed_logprobs", "--scheduling-policy", "priority"]
    if max_model_len:
        args += ["--max-model-len", str(max_model_len)]
    if eager:
        args.append("--enforce-eager")
    return args + list(extra)


def environment(cores: str | None = None, kv_cache_gib: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    if cores:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    if kv_cache_gib:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    return env

"""``rstar2 vllm``: start a vLLM server the way rstar2's RL needs it, under the Python of vLLM's own
environment (``scripts/setup-vllm.sh``: it pins another transformers than rstar2's). It needs the
development routes and ``--enable-scale-out`` (weight loads, ``/server_info``, token-in token-out
generation with each token's weight version), rstar2's worker extension, the log-probs of the
distribution sampled from (what the trainer corrects by), and priority scheduling. Every route but
``/health`` asks for the API key (vLLM's own ``--api-key`` leaves the development routes open), and
weights load only from the ``--weights-from`` folders."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import rstar2

from ..auth import FETCH_FROM_ENV, KEY_ENV, OPEN_ROUTES_ENV, WEIGHTS_FROM_ENV

SRC = Path(rstar2.__file__).resolve().parents[1]  # the folder holding the rstar2 package
EXTENSION = "rstar2.engines.vllm_worker.WorkerExtension"
ENTRY = "vllm.entrypoints.launchers.api_server.entry"  # `vllm serve` without its console script
GUARD = "rstar2.auth.vllm_guard"  # the API key on every route but /health
MIRROR = "rstar2.weight_transfer.vllm_mirror"  # /mirror_weights, inside the guard (the last is outermost)
GPU_SHARE = 0.4  # a recipe's vLLM on a GPU: its share of the GPU's memory, the trainer's beside it
LORA_SLOTS = 4  # adapters a vLLM holds at once (model.lora): the newest, older ones unloaded


def vllm_python(given: str | None = None) -> str:
    """The Python of vLLM's environment: ``given``, else ``$RSTAR2_VLLM_PYTHON``, else ``.venv-vllm``
    at the repository root, else this Python."""
    local = SRC.parent / ".venv-vllm" / "bin" / "python"
    return given or os.environ.get("RSTAR2_VLLM_PYTHON") or (str(local) if local.exists() else sys.executable)


def command(
    model: str,
    *,
    python: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    dtype: str = "auto",
    max_model_len: int | None = None,
    eager: bool = False,
    lora_rank: int | None = None,
    lora_slots: int = LORA_SLOTS,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """``lora_rank``: adapters up to that rank load at run time (``model.lora``), ``lora_slots`` of
    them held at once (the newest: requests in flight finish on the adapter they named)."""
    args = [python, "-m", ENTRY, "--model", model, "--host", host, "--port", str(port), "--dtype", dtype]
    args += ["--enable-scale-out", "--worker-extension-cls", EXTENSION]
    args += ["--middleware", MIRROR, "--middleware", GUARD]
    args += ["--logprobs-mode", "processed_logprobs", "--scheduling-policy", "priority"]
    args += ["--max-model-len", str(max_model_len)] if max_model_len else []
    if lora_rank:
        args += ["--enable-lora", "--max-lora-rank", str(lora_rank)]
        args += ["--max-loras", str(lora_slots), "--max-cpu-loras", str(lora_slots)]
    return args + (["--enforce-eager"] if eager else []) + list(extra)


def port_free(host: str, port: int) -> None:
    """Raises ``CannotListen``, naming the port, when ``host:port`` is taken: said before vLLM starts."""
    from ..local_service import listen

    listen(host, port).close()


def environment(
    cores: str | None = None,
    kv_cache_gib: int | None = None,
    *,
    api_key: str | None = None,
    weights_from: list[Path] | None = None,
    open_routes: list[str] | None = None,
    fetch_from: str | None = None,
) -> dict[str, str]:
    env = dict(os.environ)
    env[OPEN_ROUTES_ENV] = ",".join(open_routes or ())
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter (behind rstar2's guard)
    if api_key:  # in the environment, not on the command line where `ps` shows it
        env[KEY_ENV] = api_key
    env[WEIGHTS_FROM_ENV] = os.pathsep.join(str(p) for p in weights_from or ())
    env[FETCH_FROM_ENV] = fetch_from or ""  # /mirror_weights: the one weight service it fetches from
    # idle connections kept a while (vLLM's default, 5 s, closes the trainer's between its steps)
    env.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "300")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    # vLLM's own default binds all cores but one (kept for its API server): on a small machine half
    # of them; rstar2's binds every core unless told (on a GPU machine it is not read)
    env["VLLM_CPU_OMP_THREADS_BIND"] = cores or f"0-{max(0, (os.cpu_count() or 1) - 1)}"
    if kv_cache_gib:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    return env


def installed(python: str | None = None) -> bool:
    """Whether vLLM imports under ``python`` (``vllm_python``'s choice by default)."""
    exe = vllm_python(python)
    try:
        return subprocess.run([exe, "-c", "import vllm"], capture_output=True, timeout=300).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def cpu_set(cores: str) -> set[int]:
    """``0-1,4`` as {0, 1, 4} (the notation of ``VLLM_CPU_OMP_THREADS_BIND`` and ``taskset``)."""
    found: set[int] = set()
    for part in cores.split(","):
        lo, _, hi = part.partition("-")
        found.update(range(int(lo), int(hi or lo) + 1))
    return found


def local_command(
    model: Path,
    port: int,
    *,
    gpu: bool,
    weights_from: list[Path],
    cores: str | None = None,
    kv_cache_gib: int | None = None,
    dtype: str | None = None,
    gpu_share: float = GPU_SHARE,
    eager: bool = False,
    lora_rank: int | None = None,
) -> list[str]:
    """The ``rstar2 vllm`` command of ``local_server``: on a GPU, ``gpu_share`` of its memory (the
    trainer's beside it) and the model's own dtype unless given; on a CPU float32, as the trainer."""
    args = [sys.executable, "-m", "rstar2.cli", "vllm", "--model", str(model), "--port", str(port)]
    args += ["--dtype", dtype or ("auto" if gpu else "float32")]
    args += [arg for folder in weights_from for arg in ("--weights-from", str(folder))]
    args += (["--cores", cores] if cores else []) + (["--eager"] if eager else [])
    args += ["--kv-cache-gib", str(kv_cache_gib)] if kv_cache_gib else []
    args += ["--lora-rank", str(lora_rank)] if lora_rank else []
    return args + (["--", "--gpu-memory-utilization", str(gpu_share)] if gpu else [])


@contextmanager
def local_server(
    model: Path,
    log: Path,
    *,
    weights_from: list[Path],
    start_timeout_s: float,
    cores: str | None = None,
    **options,
) -> Iterator[str]:
    """``rstar2 vllm`` on ``model`` on this machine for the block (``local_command``), its output
    appended to ``log``; yields its URL once it answers. Its API key is ``$RSTAR2_API_KEY``, set to
    a fresh one when unset (this process's clients send it). With ``cores``, this process (and what
    it starts later: the code environment, the verifier) keeps to the other cores meanwhile."""
    import torch

    from ..local_service import free_port, wait_healthy

    os.environ.setdefault(KEY_ENV, secrets.token_urlsafe(24))
    port = free_port()
    gpu = torch.cuda.is_available()
    args = local_command(model, port, gpu=gpu, weights_from=weights_from, cores=cores, **options)
    before = os.sched_getaffinity(0)
    with log.open("ab") as fh:
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def log_tail() -> str:
        return f" (see {log}):\n{log.read_text(errors='replace')[-2000:]}"

    try:
        wait_healthy(url, proc, start_timeout_s, f"rstar2 vllm on {model}", log_tail)
        rest = before - cpu_set(cores) if cores else before
        os.sched_setaffinity(0, rest or before)
        yield url
    finally:
        os.sched_setaffinity(0, before)
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

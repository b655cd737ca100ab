"""The trainer's weights to the engines, with their policy version, and the proof that they serve
them. Each engine loads them its way (``Engine.load_weights``): one in the trainer's process from
tensors, checked exactly; servers from a model folder rank 0 writes, all at once, retried; one that
has not taken it stops the run (or, once it runs, leaves the rotation), so no step trains on tokens
from servers on different versions. What a server states it holds must be what was sent, and what it
computes must be the new policy (``content_check``)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ...adapters import adapted, adapter_weights, base_weights, save_adapter
from ...auth import follow_umask
from ...config import EngineSection
from ...engines.base import Engine, SamplingParams, WeightUpdate, weights_fingerprint
from ..algorithm.batch import collate
from ..passes import logprobs_of
from . import distributed as D
from .content_check import ContentCheck, Probe

PROBE_TOKENS = 16
PROBE_TEMPERATURE = 1.0  # the probe samples the plain distribution, and the trainer scores it so
PROBE_SEED = 0  # the same every load: an engine still on its old weights samples the same tokens
BASE = "base"  # an adapter's publish folder: the base model's tensors, written on a whole publish


class WeightSyncError(RuntimeError):
    """An engine did not take, or does not serve, the trainer's new weights."""


def permanent(exc: BaseException) -> bool:
    """A refusal that asking again cannot change: the key (401), the folder (403), or weights that do
    not fit the served model (400). Anything else may pass: a server restarting or busy, a folder a
    shared filesystem does not show yet."""
    status = getattr(exc, "status", None)
    return status in (401, 403) or (status == 400 and "nothing was loaded" in str(exc))


async def reload_server(engine: Engine, path: Path, settings: EngineSection, version: int) -> dict[str, Any]:
    """One server loads ``path`` as ``version``, retried with back-off unless ``permanent``."""
    for attempt in range(settings.reload_retries + 1):
        try:
            return await engine.load_weights(WeightUpdate(version, folder=path.resolve()))
        except Exception as exc:
            if attempt == settings.reload_retries or permanent(exc):
                raise WeightSyncError(
                    f"engine {engine.name} refused the new weights ({attempt + 1} tries): {exc}"
                ) from exc
        await asyncio.sleep(2.0**attempt)


def saved_tensors(folder: Path, weights: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """A model folder's tensors (no tied copies): from ``weights`` (only headers read), else loaded."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if weights is None:
        return {k: v for f in files for k, v in load_file(str(f)).items()}
    keys = set()
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            keys.update(fh.keys())
    return {k: weights[k] for k in keys}


def check_fingerprint(engine_name: str, answer: dict[str, Any], sent: dict[str, torch.Tensor]) -> None:
    """A server that states what it holds (``rstar2 serve``) must hold what was ``sent``."""
    stated, trainers = answer["weights_fingerprint"], weights_fingerprint(sent, answer.get("dtype"))
    if abs(float(stated) - trainers) > 1e-9 * max(1.0, abs(trainers)):
        raise WeightSyncError(
            f"engine {engine_name} holds other weights than the trainer sent "
            f"(fingerprint {stated!r}, trainer's {trainers!r})"
        )


async def load_into_servers(
    engines: list[Engine],
    folder: Path,
    settings: EngineSection,
    weights: dict[str, torch.Tensor] | None = None,
    *,
    version: int,
    drop_failed: bool = False,
) -> list[tuple[Engine, str]]:
    """Every server loads the folder as ``version`` at once, what each states it holds checked; any
    failure is one ``WeightSyncError`` naming every server that failed, unless ``drop_failed`` and
    some did not: then those that failed are returned with why (to leave the rotation)."""
    answers = await asyncio.gather(
        *(reload_server(e, folder, settings, version) for e in engines), return_exceptions=True
    )
    sent = None
    failed: list[tuple[Engine, str]] = []
    for e, answer in zip(engines, answers, strict=True):
        try:
            if isinstance(answer, BaseException):
                raise answer
            stated = answer.get("weights_version")
            if stated is not None and stated != version:
                raise WeightSyncError(f"engine {e.name} says it holds version {stated!r}, not {version}")
            if answer.get("weights_fingerprint") is not None:
                sent = sent if sent is not None else await asyncio.to_thread(saved_tensors, folder, weights)
                check_fingerprint(e.name, answer, sent)
            elif answer.get("parameters_written") is None and e.name not in _UNVERIFIED:
                _UNVERIFIED.add(e.name)
                print(
                    f"[rstar2] engine {e.name} states no fingerprint of the weights it holds: after each "
                    "load what it computes is checked alone (rollout.engine.weight_check_tol)",
                    file=sys.stderr,
                )
        except Exception as exc:  # noqa: BLE001 - every server's outcome is said together
            failed.append((e, str(exc)))
    if failed and not (drop_failed and len(failed) < len(engines)):
        raise WeightSyncError(
            f"{len(failed)} of {len(engines)} engines did not take the weights of version {version} "
            f"(the run stops before training on tokens from engines on different versions): "
            + "; ".join(why for _, why in failed)
        )
    return failed


_UNVERIFIED: set[str] = set()  # servers already warned about (once a process)


async def probe_engines(
    engines: list[Engine],
    model: torch.nn.Module,
    prompt_ids: list[int],
    world: D.World,
    *,
    pad_id: int,
    compute: str = "auto",
) -> list[Probe | str]:
    """Each engine's ``PROBE_TOKENS`` sampled tokens, its log-probs and the trainer's (why, for one
    that did not answer); every process calls it with its own engines (a forward under FSDP is a
    collective, so a failed engine leaves only its row out)."""
    # ahead of every queued rollout: the trainer waits on it
    params = SamplingParams(
        max_new_tokens=PROBE_TOKENS, temperature=PROBE_TEMPERATURE, seed=PROBE_SEED, priority=-(2**31)
    )
    answers: list[Any] = []
    for e in engines:
        try:
            answers.append(await e.generate(list(prompt_ids), params))
        except Exception as exc:  # noqa: BLE001 - said by the caller, which takes the engine out
            answers.append(f"engine {e.name} did not answer the probe: {type(exc).__name__}: {exc}")
    gens = [g for g in answers if not isinstance(g, str)]
    seqs = [(list(prompt_ids), g.token_ids, [1] * len(g.token_ids), g.logprobs) for g in gens]
    if not seqs:  # this process has no engine: join the collective forward with a stand-in row
        seqs = [(list(prompt_ids), [pad_id], [0], [0.0])]
    batch = collate(seqs, [0.0] * len(seqs), [0] * len(seqs), pad_id).to(world.device)
    was_training = model.training
    model.eval()
    trainers = logprobs_of(
        model, batch, max_tokens=1 << 20, world=world, compute=compute, temperature=PROBE_TEMPERATURE
    ).cpu()
    model.train(was_training)
    mask = batch.mask.cpu().bool()
    probes = iter(
        Probe(list(g.token_ids), list(g.logprobs), trainers[row][mask[row]].tolist())
        for row, g in enumerate(gens)
    )
    return [a if isinstance(a, str) else next(probes) for a in answers]


def write_parts(
    model: torch.nn.Module, folder: Path, state: dict[str, torch.Tensor], whole: bool = True
) -> list[tuple[Path, dict[str, torch.Tensor]]]:
    """What servers load, in order, written under ``folder``, each with the tensors it holds: a whole
    model, or an adapter alone (megabytes, where the model is gigabytes) after ``folder/base`` when
    ``whole``. Their files take the trainer's umask: servers may run as another user."""

    def on_cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().contiguous() for k, v in tensors.items()}

    if not adapted(model):
        state = on_cpu(state)
        model.save_pretrained(folder, state_dict=state, safe_serialization=True)
        follow_umask(folder)
        return [(folder, state)]
    adapter = on_cpu(adapter_weights(model, state))
    parts = [(save_adapter(model, folder, state), adapter)]
    if whole:
        from safetensors.torch import save_file

        base = on_cpu(base_weights(model, state))
        model.config.save_pretrained(folder / BASE)  # vLLM's load checks the sizes in config.json
        save_file(base, str(folder / BASE / "model.safetensors"), metadata={"format": "pt"})
        parts.insert(0, (folder / BASE, base))
    for part, _ in parts:
        follow_umask(part)
    return parts


def whole_parts(model: torch.nn.Module, folder: Path) -> list[Path]:
    """The folders a server that lost its weights loads, in order, to hold the last published ones."""
    return [folder / BASE, folder] if adapted(model) else [folder]


async def publish(
    model: torch.nn.Module,
    engines: list[Any],
    settings: EngineSection,
    world: D.World,
    folder: Path,
    *,
    in_place: bool,
    probe_prompt: list[int],
    pad_id: int,
    step: int,
    compute: str = "auto",
    whole: bool = True,
    check: ContentCheck | None = None,
    on_lost: Callable[[Any, str], None] | None = None,
    on_untrue: Callable[[Any, str], None] | None = None,
) -> dict[str, float]:
    """The trainer's weights as policy version ``step`` to ``engines``, checked; ``sync/*``.
    ``in_place``: the local engine decodes the trainer's own model and only learns the version;
    ``whole``: an adapter's base too; ``check``: what each server computes. With ``on_lost``, a server
    that does not take them is handed to it (out of rotation, to be revived), one that says it did and
    computes otherwise to ``on_untrue``, and the others go on (on every process: rank 0's word holds);
    only when none serves them does the step stop."""
    served = [e for e in engines if not e.local]
    # off the event loop (rollouts and tool calls of the next steps go on meanwhile), on this GPU
    gather = not in_place or served  # a server loads what rank 0 writes of them, always
    weights = await asyncio.to_thread(D.on_device(world, D.full_state_dict), model, world) if gather else None
    error: BaseException | None = None
    lost: list[str] = []
    try:
        for e in engines:
            if e.local:
                try:
                    await e.load_weights(WeightUpdate(step, tensors=weights))
                except Exception as exc:
                    raise WeightSyncError(str(exc)) from exc
        if served and world.main:
            for part, tensors in await asyncio.to_thread(write_parts, model, folder, weights, whole):
                taking = [e for e in served if e.name not in lost]
                failed = await load_into_servers(
                    taking, part, settings, tensors, version=step, drop_failed=on_lost is not None
                )
                for e, why in failed:  # only with on_lost: else load_into_servers raised
                    on_lost(e, why)  # type: ignore[misc]
                    lost.append(e.name)
    except Exception as exc:  # told to every process below, so none waits in a collective
        error = exc
    said = None if error is None else f"{type(error).__name__}: {error}"
    told = D.all_gather_objects((said, [e.name for e in engines if e.name not in lost]), world)
    if error is not None:
        raise error
    if other := next((x for x, _ in told if x), None):
        raise WeightSyncError(f"another process could not publish the weights of version {step}: {other}")
    if not served:
        return {}
    live = [e for e in served if e.name in told[0][1]]  # rank 0 loaded them: its word holds
    if on_lost is not None and not world.main:  # the servers rank 0 left out, out here too
        for e in served:
            if e.name not in told[0][1]:
                on_lost(e, f"it did not take the weights of version {step}")
    probes = await probe_engines(live, model, probe_prompt, world, pad_id=pad_id, compute=compute)
    judged = [
        (e.name, p if isinstance(p, str) else (p.gap, check.judge(e.name, p) if check else None))
        for e, p in zip(live, probes, strict=True)
    ]
    every = [x for part in D.all_gather_objects(judged, world) for x in part]  # the same on every rank
    silent = {name: d for name, d in every if isinstance(d, str)}
    untrue = {name: why for name, d in every if not isinstance(d, str) and (why := d[1])}
    stopped = on_lost is None or len(silent) + len(untrue) == len(every)
    if silent and stopped:
        raise WeightSyncError(f"with the weights of version {step}: " + "; ".join(silent.values()))
    if untrue and stopped:
        name, why = next(iter(untrue.items()))
        raise WeightSyncError(f"with the weights of version {step}, engine {name} does not serve them: {why}")
    for e in live if on_lost is not None else ():
        if e.name in silent:
            on_lost(e, silent[e.name])
        elif e.name in untrue:
            (on_untrue or on_lost)(e, untrue[e.name])
    gaps = [d[0] for name, d in every if name not in silent and name not in untrue]
    return {"sync/logprob_diff": max(gaps, default=0.0)}

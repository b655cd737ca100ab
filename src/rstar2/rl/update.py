"""The policy update of one RL step. With one mini-batch and one epoch (on-policy, the paper's
setting) the old policy *is* the current one, so old log-probs come detached from the same forward
pass: the ratio is exactly 1 and the gradient the same, at two thirds of the compute. With several
mini-batches or epochs they are computed once, before the first optimizer step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from ..chat.token_classes import CLASSES, NO_CLASS
from ..config import RLConfig
from ..rollout.trajectory import Trajectory
from .algorithm.batch import Batch, collate, take_rows, with_weights
from .algorithm.grpo import policy_loss, weight_units
from .algorithm.select import Row
from .optim import Learner, accumulate, finish_step, start_step
from .passes import forward_logprobs, logprobs_of, plan
from .run.distributed import LOCAL, World, all_max, all_sum

_MEANS = ("clip_low", "clip_high", "approx_kl", "entropy", "engine_gap", "ref_kl")


def class_entropy_means(stats: dict[str, float]) -> dict[str, float]:
    """``stats`` with each class's sum and count replaced by ``entropy/<class>`` (classes with tokens)."""
    out = {k: v for k, v in stats.items() if not k.startswith(("entropy_sum/", "entropy_tokens/"))}
    for name in CLASSES:
        n = stats.get(f"entropy_tokens/{name}", 0)
        if n:
            out[f"entropy/{name}"] = stats[f"entropy_sum/{name}"] / n
    return out


def class_entropy_sums(mb: Batch, entropy: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Entropy by token class: each class's sum and count in this micro-batch (``class_entropy_means``)."""
    if mb.token_class is None or entropy is None:
        return {}
    out = {}
    for k, name in enumerate(CLASSES):
        hit = mb.token_class == k
        out[f"entropy_sum/{name}"] = (entropy.detach().float() * hit).sum()
        out[f"entropy_tokens/{name}"] = hit.sum()
    return out


def optimizer_steps(cfg: RLConfig) -> int:
    """The learning-rate schedule's length: optimizer steps in the whole run."""
    return cfg.run.steps * cfg.optim.mini_batches * cfg.optim.epochs


def stand_in(groups: Sequence[Sequence[Trajectory]], pad: int) -> Trajectory:
    """What a process without rows joins the collectives with (zero weight): its first rollout, or a pad."""
    first = next((t for g in groups for t in g), None)
    return first if first is not None else Trajectory("", None, [pad], [pad], [0], [0.0])


def rows_batch(
    rows: Sequence[Row],
    stand_in: Trajectory,
    pad_id: int,
    aggregation: str,
    token_classes: Callable[[Sequence[int], Sequence[int]], list[int]] | None,
    world: World,
) -> Batch:
    """One mini-batch of kept rollouts, weighted over all processes (none here: ``stand_in``)."""
    if rows:
        seqs = [(t.prompt_ids, t.response_ids, t.loss_mask, t.logprobs) for t in (r.trajectory for r in rows)]
        classes = [token_classes(s[1], s[2]) for s in seqs] if token_classes else None
        b = collate(seqs, [r.advantage for r in rows], [r.group for r in rows], pad_id, classes)
    else:
        t = stand_in
        seqs = [(t.prompt_ids, t.response_ids, [0] * len(t.loss_mask), t.logprobs)]
        classes = [[NO_CLASS] * len(t.response_ids)] if token_classes else None
        b = collate(seqs, [0.0], [0], pad_id, classes)
    units = all_sum([weight_units(b.mask, b.group_index, aggregation)], world)[0]
    return with_weights(b, aggregation, units).to(world.device)


def update_on_rollouts(
    learner: Learner,
    rows: Sequence[Row],
    stand_in: Trajectory,
    cfg: RLConfig,
    *,
    pad_id: int,
    banned: Sequence[int] = (),
    ref_model: torch.nn.Module | None = None,
    token_classes: Callable[[Sequence[int], Sequence[int]], list[int]] | None = None,
    compute: str = "auto",
) -> dict[str, float]:
    """The RL update on the rollouts this process kept: ``optim.mini_batches`` optimizer steps, each
    normalised over all processes, for ``optim.epochs`` passes; log-probs under what the engine
    sampled from (the rollout's temperature, ``banned`` ids). A process with no rows joins the
    collectives with a zero-weight copy of ``stand_in``. Off-policy, the old policy is the decoupled
    objective's proximal one; the importance weights pi_prox/mu are reported (so with ``loss.tis_cap``)."""
    model, world, optim, loss = learner.model, learner.world, cfg.optim, cfg.loss
    if all_sum([len(rows)], world)[0] == 0:
        return {"update/skipped": 1.0}
    parts = [list(rows[i :: optim.mini_batches]) for i in range(optim.mini_batches)]
    batches = [rows_batch(part, stand_in, pad_id, loss.aggregation, token_classes, world) for part in parts]
    tokens = optim.micro_batch_tokens
    passes = dict(compute=compute, temperature=cfg.rollout.temperature, banned=banned)
    if optim.mini_batches > 1 or optim.epochs > 1:
        batches = [replace(b, old_logp=logprobs_of(model, b, tokens, world, **passes)) for b in batches]
    if ref_model is not None:  # the KL to the start: a term of the loss (loss.kl_coef), or a metric
        batches = [replace(b, ref_logp=logprobs_of(ref_model, b, tokens, LOCAL, **passes)) for b in batches]
    report = cfg.asynchronous.off_policy or loss.tis_cap is not None  # the importance weights, in the metrics
    ratios = [(b.old_logp - b.engine_logp)[b.mask.bool()] for b in batches if b.old_logp is not None]
    out = []
    for _ in range(optim.epochs):
        for batch in batches:  # one optimizer step (the batch's weights hold the global normaliser)
            sums = start_step(learner)
            for part in plan(batch, tokens, world):
                mb = take_rows(batch, part)
                logp, entropy = forward_logprobs(model, mb, True, **passes)
                old = mb.old_logp if mb.old_logp is not None else logp.detach()
                if report and mb.old_logp is None:  # the weights before this step are the old policy
                    ratios.append((old - mb.engine_logp)[mb.mask.bool()])
                micro_loss, stats = policy_loss(
                    logp, old, mb.advantages, mb.weights, loss,
                    engine_logp=mb.engine_logp, ref_logp=mb.ref_logp, entropy=entropy,
                )  # fmt: skip
                accumulate(micro_loss, {**stats, **class_entropy_sums(mb, entropy)}, sums, world)
            done = finish_step(learner, sums, optim.grad_clip)
            w = done.pop("weight") or 1.0  # weighted sums → means over the batch's tokens
            means = {f"update/{k}": done.pop(k) / w for k in _MEANS if k in done}
            out.append({**done, **means})
    summed = {k for k in out[0] if k.startswith(("entropy_sum/", "entropy_tokens/"))}
    stats = {k: sum(o[k] for o in out) / (1 if k in summed else len(out)) for k in out[0]}
    weights = importance_weights(ratios, loss.tis_cap, world) if report else {}
    return {**class_entropy_means(stats), **weights}


def importance_weights(
    log_ratios: Sequence[torch.Tensor], cap: float | None, world: World
) -> dict[str, float]:
    """pi_old / mu over the trained tokens (mu: the engine's): mean, largest, the share over ``cap``."""
    total = count = over = top = 0.0
    for r in log_ratios:
        w = r.detach().clamp(-20.0, 20.0).exp()
        if w.numel():
            total, count, top = total + float(w.sum()), count + w.numel(), max(top, float(w.max()))
            over += float((w > cap).sum()) if cap else 0.0
    top = all_max(top, world)
    total, count, over = all_sum([total, count, over], world)
    if not count:
        return {}
    out = {"update/tis_mean": total / count, "update/tis_max": top}
    return {**out, "update/tis_truncated": over / count} if cap else out

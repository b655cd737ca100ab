"""The policy update of one RL step: recompute old logprobs, clipped loss, accumulate, clip, step.

With one mini-batch and one epoch (on-policy, the paper's setting) the old policy *is* the current
one, so old logprobs are taken from the same forward pass (detached) instead of a second pass: the
ratio is exactly 1 and the gradient the same, at two thirds of the compute. With several
mini-batches or epochs they are recomputed once, before the first optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

import torch

from ..chat.token_classes import CLASSES, NO_CLASS
from ..config import LossSection, OptimSection
from ..device import compute_precision
from .batch import Batch, collate, plan_micro_batches, take_rows, with_weights
from .distributed import LOCAL, World, all_max, all_sum
from .grpo import policy_loss, token_logprobs, weight_units

if TYPE_CHECKING:
    from torch.optim.lr_scheduler import LRScheduler

    from ..rollout.trajectory import Trajectory


class Learner(NamedTuple):
    """The model being trained, its optimizer and schedule, and the processes that share it."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr_schedule: LRScheduler
    world: World = LOCAL


DEFAULT_OPTIM = OptimSection()
_MEANS = ("clip_low", "clip_high", "approx_kl", "entropy", "engine_gap", "ref_kl")


def forward_logprobs(
    model: torch.nn.Module,
    mb: Batch,
    with_entropy: bool = False,
    compute: str = "auto",
    temperature: float = 1.0,
    banned: Sequence[int] = (),
):
    """Log-probs of the labels, (rows, T-1), and optionally entropies. Logits are only computed
    from the first position any row learns from: the prompt's vocabulary projections and
    log-softmaxes are never needed (most of the compute of the head for a long prompt).
    ``compute``: ``model.compute``; ``temperature`` and ``banned`` (``rollout.banned_tokens``): the
    rollouts', so that the distribution trained on is the one the engine sampled from."""
    width = mb.labels.shape[1]
    learn = mb.mask.any(dim=0).nonzero()
    start = int(learn[0]) if len(learn) else width - 1
    with compute_precision(mb.input_ids.device, compute):
        logits = model(
            input_ids=mb.input_ids,
            attention_mask=mb.attention_mask,
            use_cache=False,
            logits_to_keep=width + 1 - start,
        ).logits
    ban = torch.tensor(sorted(set(banned)), dtype=torch.long) if banned else None  # each mass once
    logp, entropy = token_logprobs(logits[:, :-1], mb.labels[:, start:], with_entropy, temperature, ban)
    if start:
        pad = logp.new_zeros(logp.shape[0], start)
        logp = torch.cat([pad, logp], dim=1)
        entropy = torch.cat([pad, entropy], dim=1) if entropy is not None else None
    return logp, entropy


def plan(batch: Batch, max_tokens: int, world: World) -> list[list[int]]:
    """Micro-batch rows; under FSDP every process gets as many (each forward is a collective)."""
    rows = plan_micro_batches(batch, max_tokens)
    if world.distributed:
        rows = plan_micro_batches(batch, max_tokens, count=all_max(len(rows), world))
    return rows


@torch.no_grad()
def logprobs_of(
    model: torch.nn.Module,
    batch: Batch,
    max_tokens: int,
    world: World = LOCAL,
    compute: str = "auto",
    temperature: float = 1.0,
    banned: Sequence[int] = (),
) -> torch.Tensor:
    """(rows, T-1) log-probs of the batch's labels under ``model`` (micro-batched, no grad)."""
    out = torch.zeros_like(batch.mask)
    for rows in plan(batch, max_tokens, world):
        mb = take_rows(batch, rows)
        logp, _ = forward_logprobs(model, mb, compute=compute, temperature=temperature, banned=banned)
        if rows:
            out[torch.tensor(rows), : logp.shape[1]] = logp.float()
    return out


def optimizer_step(
    learner: Learner,
    batch: Batch,
    micro_loss: Callable[[Batch], tuple[torch.Tensor, dict[str, torch.Tensor]]],
    *,
    grad_clip: float,
    max_tokens: int,
) -> dict[str, float]:
    """Gradient accumulation over micro-batches, clipping, one optimizer and learning-rate step (the
    loop SFT and RL share). ``micro_loss`` returns a micro-batch's loss, already weighted for the
    whole batch, and sums for metrics; both come back summed over micro-batches and processes."""
    model, optimizer, lr_schedule, world = learner
    model.train()
    optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {"loss": 0.0}
    for rows in plan(batch, max_tokens, world):
        loss, stats = micro_loss(take_rows(batch, rows))
        # FSDP averages gradients over processes; the weights are already global, so undo that.
        (loss * world.size).backward()
        for k, v in {"loss": loss.detach(), **stats}.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    optimizer.step()
    lr_schedule.step()
    totals = dict(zip(sums, all_sum(list(sums.values()), world), strict=True))
    return {**totals, "grad_norm": grad_norm, "lr": lr_schedule.get_last_lr()[0]}


def class_entropy_means(stats: dict[str, float]) -> dict[str, float]:
    """``stats`` with each class's sum and count replaced by ``entropy/<class>`` (classes with no
    token in this step are left out)."""
    out = {k: v for k, v in stats.items() if not k.startswith(("entropy_sum/", "entropy_tokens/"))}
    for name in CLASSES:
        n = stats.get(f"entropy_tokens/{name}", 0)
        if n:
            out[f"entropy/{name}"] = stats[f"entropy_sum/{name}"] / n
    return out


def policy_update(
    learner: Learner,
    batch: Batch,
    loss_cfg: LossSection,
    optim: OptimSection = DEFAULT_OPTIM,
    *,
    compute: str = "auto",
    temperature: float = 1.0,
    banned: Sequence[int] = (),
    ratios: list[torch.Tensor] | None = None,
) -> dict[str, float]:
    """One clipped-policy-gradient step over ``batch`` (whose weights hold the global normaliser).
    ``ratios``: where the batch has no old log-probs (the weights before this step are the old
    policy), gets log pi_old/mu of each trained token, for ``importance_weights``."""

    def micro_loss(mb: Batch):
        logp, entropy = forward_logprobs(learner.model, mb, True, compute, temperature, banned)
        old = mb.old_logp if mb.old_logp is not None else logp.detach()
        if ratios is not None and mb.old_logp is None:
            ratios.append((old - mb.engine_logp)[mb.mask.bool()])
        loss, stats = policy_loss(
            logp,
            old,
            mb.advantages,
            mb.weights,
            loss_cfg,
            engine_logp=mb.engine_logp,
            ref_logp=mb.ref_logp,
            entropy=entropy,
        )
        # entropy by token class: sums and counts over micro-batches (``class_entropy_means``)
        if mb.token_class is not None and entropy is not None:
            for k, name in enumerate(CLASSES):
                hit = mb.token_class == k
                stats[f"entropy_sum/{name}"] = (entropy.detach().float() * hit).sum()
                stats[f"entropy_tokens/{name}"] = hit.sum()
        return loss, stats

    out = optimizer_step(
        learner, batch, micro_loss, grad_clip=optim.grad_clip, max_tokens=optim.micro_batch_tokens
    )
    w = out.pop("weight") or 1.0  # weighted sums → means over the batch's tokens
    means = {f"update/{k}": out.pop(k) / w for k in _MEANS if k in out}
    return {**out, **means}


class Row(NamedTuple):
    """A rollout RoC kept, with its advantage and the index of its group (for per-group losses)."""

    trajectory: Trajectory
    advantage: float
    group: int


def rows_batch(
    rows: Sequence[Row],
    stand_in: Trajectory,
    pad_id: int,
    aggregation: str,
    token_classes: Callable[[Sequence[int], Sequence[int]], list[int]] | None,
    world: World,
) -> Batch:
    """One mini-batch of kept rollouts, weighted over all processes (``loss.aggregation``); none
    here: ``stand_in`` with zero weight, so this process still joins the collectives."""
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
    *,
    pad_id: int,
    optim: OptimSection,
    loss: LossSection,
    ref_model: torch.nn.Module | None = None,
    token_classes: Callable[[Sequence[int], Sequence[int]], list[int]] | None = None,
    compute: str = "auto",
    temperature: float = 1.0,
    banned: Sequence[int] = (),
    off_policy: bool = False,
) -> dict[str, float]:
    """The RL update on the rollouts this process kept (``rows``). With ``token_classes`` (response
    ids, loss mask → a class per token, ``chat.token_classes.TokenClasses``) the step also reports
    the mean entropy of each class.

    ``optim.mini_batches`` optimizer steps per call, each on a share of the rows and normalised
    over all processes, ``optim.epochs`` passes. A process with no rows (all its groups dropped)
    still joins the collectives with a zero-weight copy of ``stand_in``. ``off_policy``: the
    rollouts were sampled by older weights (asynchronous RL): the old policy is then the proximal
    one of the decoupled objective, and the importance weights pi_prox/mu are reported (also
    whenever ``loss.tis_cap`` applies them).
    """
    model, world = learner.model, learner.world
    if all_sum([len(rows)], world)[0] == 0:
        return {"update/skipped": 1.0}
    parts = [list(rows[i :: optim.mini_batches]) for i in range(optim.mini_batches)]
    batches = [rows_batch(part, stand_in, pad_id, loss.aggregation, token_classes, world) for part in parts]
    tokens = optim.micro_batch_tokens
    passes = dict(compute=compute, temperature=temperature, banned=banned)
    # The old policy (of the clip; the proximal one of the decoupled objective) is the weights before
    # the first optimizer step: with one step per update, the step's own pass computes it
    if optim.mini_batches > 1 or optim.epochs > 1:
        batches = [replace(b, old_logp=logprobs_of(model, b, tokens, world, **passes)) for b in batches]
    if loss.kl_coef and ref_model is not None:
        batches = [replace(b, ref_logp=logprobs_of(ref_model, b, tokens, LOCAL, **passes)) for b in batches]
    report = off_policy or loss.tis_cap is not None  # the importance weights, in the metrics
    ratios = [(b.old_logp - b.engine_logp)[b.mask.bool()] for b in batches if b.old_logp is not None]
    step = dict(passes, ratios=ratios if report else None)
    out = [policy_update(learner, b, loss, optim, **step) for _ in range(optim.epochs) for b in batches]
    summed = {k for k in out[0] if k.startswith(("entropy_sum/", "entropy_tokens/"))}
    stats = {k: sum(o[k] for o in out) / (1 if k in summed else len(out)) for k in out[0]}
    weights = importance_weights(ratios, loss.tis_cap, world) if report else {}
    return {**class_entropy_means(stats), **weights}


def importance_weights(
    log_ratios: Sequence[torch.Tensor], cap: float | None, world: World
) -> dict[str, float]:
    """pi_old / mu over the trained tokens, from their log-ratios (old: the policy at the start of
    the update; mu: the engine that sampled them): the mean, the largest and the share truncated
    at ``cap`` (None: no truncation, and none reported)."""
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

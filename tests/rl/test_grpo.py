"""Advantages, token weights and the clipped loss against hand-computed values; a gradient check."""

from __future__ import annotations

import math

import pytest
import torch

from rstar2.config import LossSection, RLConfig
from rstar2.rl.algorithm.batch import collate, plan_micro_batches, take_rows, with_weights
from rstar2.rl.algorithm.grpo import (
    group_advantages,
    policy_loss,
    token_logprobs,
    token_weights,
    weight_units,
)


def test_group_advantages_by_hand():
    (adv,) = group_advantages([[1, 0, 0, 1]])
    # mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735
    assert adv == pytest.approx([0.8660254, -0.8660254, -0.8660254, 0.8660254], abs=1e-5)
    assert group_advantages([[1, 1, 1]]) == [[0.0, 0.0, 0.0]]
    assert group_advantages([[1.0]]) == [[0.0]]
    assert group_advantages([[]]) == [[]]
    assert group_advantages([[1, 0, 0]], scale_by_std=False)[0] == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    # 1 incorrect, 15 correct: the negative carries most of the magnitude
    (adv,) = group_advantages([[0.0] + [1.0] * 15])
    std = math.sqrt((15 * (1 / 16) ** 2 + (15 / 16) ** 2) / 15)
    assert adv[0] == pytest.approx(-(15 / 16) / std, rel=1e-5)
    assert adv[1] == pytest.approx((1 / 16) / std, rel=1e-5)


def test_token_weights_token_mean_and_per_group():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    w = token_weights(mask)
    assert torch.allclose(w, mask / 3)
    w = token_weights(mask, torch.tensor([0, 1]), "group-token-mean")
    assert torch.allclose(w, torch.tensor([[0.25, 0.25, 0.0], [0.5, 0.0, 0.0]]))
    # another process's share: the denominator of the whole batch is given
    assert torch.allclose(token_weights(mask, units=6.0), mask / 6)
    assert weight_units(mask, torch.tensor([0, 0]), "group-token-mean") == 1.0
    # empty masks give zero weights, never NaN
    empty = torch.zeros(2, 3)
    assert torch.equal(token_weights(empty), empty)
    assert torch.equal(token_weights(empty, torch.tensor([0, 1]), "group-token-mean"), empty)
    with pytest.raises(ValueError, match="aggregation"):
        token_weights(mask, aggregation="seq-mean")  # type: ignore[arg-type]


def _loss(ratio: float, adv: float, cfg: LossSection | None = None):
    old = torch.zeros(1, 1)
    logp = torch.full((1, 1), math.log(ratio), requires_grad=True)
    loss, stats = policy_loss(logp, old, torch.full((1, 1), adv), torch.ones(1, 1), cfg or LossSection())
    loss.backward()
    return float(loss.detach()), float(logp.grad), stats


def test_clip_higher_by_hand():
    # inside the band: -A * ratio, gradient -A * ratio
    assert _loss(1.1, 1.0)[:2] == pytest.approx((-1.1, -1.1))
    assert _loss(0.9, -1.0)[:2] == pytest.approx((0.9, 0.9))
    # A > 0 above 1 + 0.28: clipped at -1.28, no gradient
    loss, grad, stats = _loss(1.5, 1.0)
    assert (loss, grad) == pytest.approx((-1.28, 0.0))
    assert float(stats["clip_high"]) == 1.0 and float(stats["clip_low"]) == 0.0
    # 1.25 is still inside the higher band (it would be clipped with a symmetric 0.2)
    assert _loss(1.25, 1.0)[1] == pytest.approx(-1.25)
    # A < 0 below 1 - 0.2: clipped at 0.8, no gradient
    loss, grad, stats = _loss(0.5, -1.0)
    assert (loss, grad) == pytest.approx((0.8, 0.0))
    assert float(stats["clip_low"]) == 1.0
    # A < 0 above the band is *not* clipped (the pessimistic max keeps the larger loss)
    assert _loss(1.5, -1.0)[:2] == pytest.approx((1.5, 1.5))


def test_all_tokens_clipped_gives_zero_gradient_and_empty_mask_zero_loss():
    old = torch.zeros(2, 3)
    logp = torch.full((2, 3), math.log(2.0), requires_grad=True)
    loss, _ = policy_loss(logp, old, torch.ones(2, 3), torch.full((2, 3), 1 / 6))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-1.28) and torch.count_nonzero(logp.grad) == 0
    logp.grad = None
    loss, stats = policy_loss(logp, old, torch.ones(2, 3), torch.zeros(2, 3))
    loss.backward()
    assert (
        float(loss.detach()) == 0.0 and torch.count_nonzero(logp.grad) == 0 and float(stats["weight"]) == 0.0
    )


def test_kl_and_truncated_importance_sampling_by_hand():
    old, logp = torch.zeros(1, 1), torch.zeros(1, 1)
    ref = torch.full((1, 1), math.log(0.5))
    # k3: exp(d) - d - 1 with d = ref - logp = log 0.5 → 0.5 + 0.6931 - 1 = 0.19315
    loss, _ = policy_loss(
        logp, old, torch.zeros(1, 1), torch.ones(1, 1), LossSection(kl_coef=2.0), ref_logp=ref
    )
    assert float(loss) == pytest.approx(2 * (0.5 + math.log(2) - 1), rel=1e-5)
    # TIS: weight min(exp(old - engine), cap) = min(e^1, 2) = 2 on -A * 1
    engine = torch.full((1, 1), -1.0)
    loss, stats = policy_loss(
        logp, old, torch.ones(1, 1), torch.ones(1, 1), LossSection(tis_cap=2.0), engine_logp=engine
    )
    assert float(loss) == pytest.approx(-2.0)
    assert float(stats["engine_gap"]) == pytest.approx(1.0)


def test_collate_shifts_mask_and_logprobs_by_one():
    b = collate(
        [([5, 6], [7, 8, 9], [1, 0, 1], [-0.1, 0.0, -0.3]), ([5], [7], [1], [-0.2])], [1.0, -1.0], [0, 0]
    )
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 7, 0, 0, 0]]
    assert b.labels.tolist() == [[6, 7, 8, 9], [7, 0, 0, 0]]
    # position t predicts token t+1: 7 (learn), 8 (tool token, masked), 9 (learn)
    assert b.mask.tolist() == [[0, 1, 0, 1], [1, 0, 0, 0]]
    assert b.engine_logp[0].tolist() == pytest.approx([0.0, -0.1, 0.0, -0.3])
    assert b.advantages[1].tolist() == [-1.0] * 4
    with pytest.raises(ValueError, match="same length"):
        collate([([1], [2, 3], [1], [0.0, 0.0])], [0.0], [0])


def test_micro_batches_do_not_change_the_loss():
    torch.manual_seed(0)
    seqs = [([1, 2], list(range(3, 3 + n)), [1] * n, [0.0] * n) for n in (1, 4, 2, 7, 3)]
    b = with_weights(collate(seqs, [1.0, -0.5, 0.25, 2.0, -1.0], [0, 0, 1, 1, 1]), "token-mean")
    logits = torch.randn(b.rows, b.input_ids.shape[1], 16)

    full_logp, _ = token_logprobs(logits[:, :-1], b.labels, temperature=1.0)
    full, _ = policy_loss(full_logp, full_logp.detach() - 0.1, b.advantages, b.weights)
    parts = [take_rows(b, rows) for rows in plan_micro_batches(b, max_tokens=12)]
    assert len(parts) > 1 and sum(p.rows for p in parts) == b.rows
    total = 0.0
    lengths = b.attention_mask.sum(dim=1).tolist()
    order = sorted(range(b.rows), key=lambda i: lengths[i])
    at = 0
    for p in parts:
        idx = order[at : at + p.rows]
        at += p.rows
        w = p.input_ids.shape[1]
        lp, _ = token_logprobs(logits[idx][:, : w - 1], p.labels, temperature=1.0)
        part_loss, _ = policy_loss(lp, lp.detach() - 0.1, p.advantages, p.weights)
        total += float(part_loss)
    assert total == pytest.approx(float(full), rel=1e-5)


def test_gradient_of_the_loss_on_a_tiny_model_matches_finite_differences(tiny):
    """d loss / d θ by autograd equals a central finite difference on a real model (float64)."""
    import copy

    model = copy.deepcopy(tiny[0]).double().train()
    seqs = [([1, 2, 3], [4, 5, 6, 7], [1, 1, 0, 1], [0.0] * 4), ([1, 2], [9, 8], [1, 1], [0.0] * 2)]
    b = with_weights(collate(seqs, [0.7, -0.7], [0, 0]), "token-mean")

    def logprobs():
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[:, :-1]
        return token_logprobs(logits, b.labels, temperature=1.0)[0]

    with torch.no_grad():  # an old policy a little off the current one: ratios spread around 1
        start = logprobs()
        old = start + 0.3 * torch.sin(torch.arange(start.numel(), dtype=torch.float64)).view_as(start)

    def loss_fn():
        return policy_loss(logprobs(), old, b.advantages.double(), b.weights.double())[0]

    param = model.model.layers[0].mlp.down_proj.weight
    model.zero_grad()
    loss_fn().backward()
    grad = param.grad.clone()
    h = 1e-3  # transformers' RMSNorm computes in float32 even for a float64 model: no smaller steps
    for idx in [(0, 0), (3, 5), (10, 7)]:
        with torch.no_grad():
            param[idx] += h
            up = float(loss_fn())
            param[idx] -= 2 * h
            down = float(loss_fn())
            param[idx] += h
        # float32 RMSNorm: the loss is exact to ~1e-7 relative, i.e. ~5e-6 in a difference over 2h
        assert grad[idx].item() == pytest.approx((up - down) / (2 * h), rel=2e-3, abs=5e-6)
    assert grad.abs().max() > 1e-4  # large next to that tolerance: a wrong gradient shows


def _rows(seqs, advantages, groups):
    """Kept rollouts as the trainer hands them to the update."""
    from rstar2.rl.algorithm.select import Row
    from rstar2.rollout.trajectory import Trajectory

    return [
        Row(Trajectory("", None, p, r, m, lp), a, g)
        for (p, r, m, lp), a, g in zip(seqs, advantages, groups, strict=True)
    ]


def config_with(**sections) -> RLConfig:
    """A config holding ``sections`` (what the update reads of it), the rest defaults."""
    return RLConfig(model={"path": "-"}, data={"train": "-"}, **sections)


def _update(model, rows, loss, **kw):
    """One update of ``model`` at lr 0 on ``rows`` (the loss and metrics, no change to the weights)."""
    from rstar2.config import OptimSection
    from rstar2.rl.optim import Learner, build_optimizer
    from rstar2.rl.update import update_on_rollouts

    opt, sched = build_optimizer(model, OptimSection(lr=0.0, warmup_steps=0), total_steps=1)
    learner = Learner(model, opt, sched)
    return update_on_rollouts(learner, rows, rows[0].trajectory, config_with(loss=loss), pad_id=0, **kw)


def _rows_and_a_moved_copy(model):
    """Four rows in two groups, and a copy of ``model`` with every weight moved a little."""
    import copy

    seqs = [([5, 6, 7], [8 + i, 9 + i, 10 + i], [1, 1, 1], [0.0] * 3) for i in range(4)]
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return _rows(seqs, [1.0, -1.0, 0.5, -0.5], [0, 0, 1, 1]), other


def test_kl_to_a_reference_model_enters_the_update(tiny):
    """With kl_coef > 0 the update reads the reference's logprobs: a reference equal to the policy
    adds nothing; a different one adds kl_coef times its (positive) k3 estimate to the loss."""
    import copy

    model, _ = tiny
    rows, other = _rows_and_a_moved_copy(model)

    def loss_with(ref):
        return _update(copy.deepcopy(model), rows, LossSection(kl_coef=0.3), ref_model=ref)

    plain, same, moved = loss_with(None), loss_with(model), loss_with(other)
    assert "update/ref_kl" not in plain
    assert same["update/ref_kl"] == pytest.approx(0.0, abs=1e-6)
    assert same["loss"] == pytest.approx(plain["loss"], abs=1e-6)
    assert moved["update/ref_kl"] > 1e-4
    assert moved["loss"] == pytest.approx(plain["loss"] + 0.3 * moved["update/ref_kl"], rel=1e-4)


def test_kl_to_the_start_is_measured_without_entering_the_loss(tiny):
    """With kl_coef 0 and a reference (``run.kl_to_start``) the update reports the same k3 estimate
    the KL term would add, and its loss and gradient are those of the plain update."""
    import copy

    model, _ = tiny
    rows, other = _rows_and_a_moved_copy(model)
    plain = _update(copy.deepcopy(model), rows, LossSection())
    measured = _update(copy.deepcopy(model), rows, LossSection(), ref_model=other)
    term = _update(copy.deepcopy(model), rows, LossSection(kl_coef=0.3), ref_model=other)
    assert measured["loss"] == pytest.approx(plain["loss"], abs=1e-7)
    assert measured["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-6)
    assert measured["update/ref_kl"] > 1e-4
    assert measured["update/ref_kl"] == pytest.approx(term["update/ref_kl"], rel=1e-5)


def test_entropy_by_class_is_the_mean_entropy_of_each_class_tokens(tiny):
    """The step's ``entropy/<class>`` is the plain mean, over that class's tokens, of the policy's
    next-token entropy at those positions (tool tokens, class -1, belong to none)."""
    from rstar2.chat.token_classes import CLASSES

    model, _ = tiny
    prompts = [[5, 6, 7], [5, 9]]
    responses = [[8, 9, 10, 11, 12], [13, 14, 15]]
    masks = [[1, 1, 0, 1, 1], [1, 1, 1]]
    classes = [[2, 2, -1, 1, 3], [0, 0, 3]]  # code code tool reflection answer | reasoning×2 answer
    seqs = [(p, r, m, [0.0] * len(r)) for p, r, m in zip(prompts, responses, masks, strict=True)]

    def token_classes(response, mask):
        return classes[responses.index(list(response))]

    stats = _update(model, _rows(seqs, [1.0, -1.0], [0, 0]), LossSection(), token_classes=token_classes)

    expected: dict[str, list[float]] = {c: [] for c in CLASSES}
    with torch.no_grad():
        for p, r, cls in zip(prompts, responses, classes, strict=True):
            logits = model(input_ids=torch.tensor([p + r])).logits[0].float()
            for j, k in enumerate(cls):
                if k >= 0:
                    logp = torch.log_softmax(logits[len(p) - 1 + j], dim=-1)
                    expected[CLASSES[k]].append(float(-(logp.exp() * logp).sum()))
    for name, values in expected.items():
        assert stats[f"entropy/{name}"] == pytest.approx(sum(values) / len(values), rel=1e-4), name
    assert not any(k.startswith(("entropy_sum/", "entropy_tokens/")) for k in stats)


def test_token_classes_decode_each_id_once_and_follow_classify():
    from rstar2.chat.token_classes import CLASSES, NO_CLASS, TokenClasses, classify

    table = {
        1: "<tool_call>",
        2: "print(1)",
        3: "</tool_call>",
        4: "7",
        5: "so",
        6: " <answer>",
        7: "7",
        8: "</answer>",
    }
    calls: list[int] = []

    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            calls.append(ids[0])
            return table[ids[0]]

    ids, mask = [1, 2, 3, 4, 5, 6, 7, 8, 5], [1, 1, 1, 0, 1, 1, 1, 1, 1]
    got = TokenClasses(Tok(), window=1)(ids, mask)
    names = classify([table[i] for i in ids], mask, 1)
    assert got == [NO_CLASS if n is None else CLASSES.index(n) for n in names]
    assert got[:4] == [CLASSES.index("code")] * 3 + [NO_CLASS]
    assert got[4] == CLASSES.index("reflection") and got[-1] == CLASSES.index("reasoning")
    assert sorted(calls) == sorted(set(ids))  # each id decoded once


@pytest.mark.parametrize("temperature", [0.6, 1.4])
async def test_the_update_takes_logprobs_at_the_sampling_temperature(tiny, temperature):
    """The engine reports log-probs of logits / T; every pass of the update takes them the same way,
    so at T != 1 the engine's and the trainer's log-probs of the same tokens agree (engine_gap ~ 0),
    where a pass at T = 1 would not."""
    import copy

    from rstar2.config import OptimSection
    from rstar2.engines.base import SamplingParams
    from rstar2.engines.hf import HFEngine
    from rstar2.rl.algorithm.select import Row
    from rstar2.rl.optim import build_optimizer
    from rstar2.rl.update import Learner, update_on_rollouts
    from rstar2.rollout.trajectory import Trajectory

    model, tok = tiny
    engine = HFEngine(model, max_batch_size=4)
    prompts = [tok.encode(f"question {i}: what is {i} + {i}?", add_special_tokens=False) for i in range(4)]
    try:
        gens = [
            await engine.generate(p, SamplingParams(max_new_tokens=10, temperature=temperature, seed=i))
            for i, p in enumerate(prompts)
        ]
    finally:
        await engine.close()
    rows = [
        Row(Trajectory("", None, p, g.token_ids, [1] * len(g.token_ids), g.logprobs), adv, i // 2)
        for i, (p, g, adv) in enumerate(zip(prompts, gens, [1.0, -1.0, 0.5, -0.5], strict=True))
    ]

    def gap(at: float) -> float:
        m = copy.deepcopy(model)
        opt, sched = build_optimizer(m, OptimSection(lr=0.0, warmup_steps=0), total_steps=1)
        stats = update_on_rollouts(
            Learner(m, opt, sched),
            rows,
            rows[0].trajectory,
            config_with(rollout={"temperature": at}),
            pad_id=tok.pad_token_id or 0,
            compute="fp32",
        )
        return stats["update/engine_gap"]

    assert gap(temperature) < 1e-4
    assert gap(1.0) > 100 * max(gap(temperature), 1e-6)


async def test_the_decoupled_weights_come_from_the_steps_own_pass_and_match_a_separate_one(tiny):
    """With one optimizer step per update the proximal policy is the weights before that step:
    its log-probs come from the step's own pass, no pass before it. The importance weights
    pi_prox/mu reported are those of a separate pass over the same weights, mu being each token's
    own behaviour log-prob (here the engine's, shifted per token)."""
    import copy

    from rstar2.config import LossSection, OptimSection
    from rstar2.engines.base import SamplingParams
    from rstar2.engines.hf import HFEngine
    from rstar2.rl import update as U
    from rstar2.rl.optim import build_optimizer
    from rstar2.rollout.trajectory import Trajectory

    model, tok = tiny
    engine = HFEngine(model, max_batch_size=4)
    prompts = [tok.encode(f"question {i}: what is {i} * 3?", add_special_tokens=False) for i in range(3)]
    try:
        gens = [
            await engine.generate(p, SamplingParams(max_new_tokens=8, seed=i)) for i, p in enumerate(prompts)
        ]
    finally:
        await engine.close()
    # behaviour log-probs of an older policy: each token off by its own amount
    shift = [[0.05 * ((i + j) % 7) - 0.15 for j in range(len(g.token_ids))] for i, g in enumerate(gens)]
    rows = [
        U.Row(
            Trajectory(
                "",
                None,
                p,
                g.token_ids,
                [1] * len(g.token_ids),
                [a + d for a, d in zip(g.logprobs, s, strict=True)],
            ),
            adv,
            i,
        )
        for i, (p, g, s, adv) in enumerate(zip(prompts, gens, shift, [1.0, -1.0, 0.5], strict=True))
    ]
    ratios = [torch.tensor([-d for d in s]) for s in shift]  # log pi_prox/mu, pi_prox = the engine's weights
    want = U.importance_weights(ratios, 1.1, U.LOCAL)
    passes = []
    real = U.logprobs_of
    U.logprobs_of = lambda *a, **k: passes.append(1) or real(*a, **k)
    try:
        m = copy.deepcopy(model)
        opt, sched = build_optimizer(m, OptimSection(lr=1e-3, warmup_steps=0), total_steps=1)
        got = U.update_on_rollouts(
            U.Learner(m, opt, sched),
            rows,
            rows[0].trajectory,
            config_with(loss=LossSection(tis_cap=1.1), asynchronous={"max_staleness": 1}),
            pad_id=tok.pad_token_id or 0,
            compute="fp32",
        )
    finally:
        U.logprobs_of = real
    assert passes == []  # no pass before the step
    for key in ("update/tis_mean", "update/tis_max", "update/tis_truncated"):
        assert got[key] == pytest.approx(want[key], abs=1e-4), key
    assert 0 < want["update/tis_truncated"] < 1 and want["update/tis_max"] > 1.1


def test_banned_tokens_are_left_out_of_the_trainers_distribution_by_hand():
    """Weights 1, 2, 3 (logits 0, log 2, log 3) with token 2 banned: p(1) = 2/3 as the engine
    renormalises, not 2/6; the entropy is that of (1/3, 2/3), finite."""
    import math

    logits = torch.tensor([[[0.0, math.log(2.0), math.log(3.0)]]], requires_grad=True)
    labels = torch.tensor([[1]])
    logp, entropy = token_logprobs(logits, labels, True, temperature=1.0, banned=torch.tensor([2]))
    assert float(logp.detach()) == pytest.approx(math.log(2 / 3), abs=1e-6)
    assert float(entropy.detach()) == pytest.approx(
        -(1 / 3) * math.log(1 / 3) - (2 / 3) * math.log(2 / 3), abs=1e-6
    )
    logp.sum().backward()  # the ban leaves the model's logits as they were, and the gradient flows
    assert logits.grad is not None and float(logits.grad[0, 0, 2]) == 0.0
    full, _ = token_logprobs(logits.detach(), labels, temperature=1.0)
    assert float(full) == pytest.approx(math.log(2 / 6), abs=1e-6)

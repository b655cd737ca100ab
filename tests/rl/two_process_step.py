"""One RL update on a fixed batch of rollouts, in one process or under torchrun (FSDP2 on gloo).

Run by test_distributed.py: ``python two_process_step.py MODEL OUT`` and
``torchrun --nproc-per-node 2 two_process_step.py MODEL OUT``. Each process takes whole groups
(group % world size == rank), as the trainer does; rank 0 saves the full parameters afterwards.
SGD keeps the parameters a linear function of the gradient (AdamW's first step is lr·sign(g), which
would turn float rounding of near-zero gradients into visible differences), and the passes compute
in fp32 (``compute="fp32"``): bf16 autocast, which ``auto`` picks on a CPU with AVX512-BF16, rounds
differently when the batch is split another way, and this compares the split, not the precision.
"""

from __future__ import annotations

import random
import sys

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import AutoModelForCausalLM

from rstar2.config import OptimSection, RLConfig
from rstar2.rl.algorithm.grpo import group_advantages
from rstar2.rl.algorithm.select import Row
from rstar2.rl.run import distributed as D
from rstar2.rl.update import Learner, update_on_rollouts
from rstar2.rollout.trajectory import Trajectory


def fixed_rows(groups: int = 4, per_group: int = 4) -> list[Row]:
    rng = random.Random(0)
    rows = []
    for g in range(groups):
        rewards = [float(rng.random() < 0.5) for _ in range(per_group)]
        rewards[0], rewards[1] = 1.0, 0.0
        for t, adv in zip(range(per_group), group_advantages([rewards])[0], strict=True):
            n = rng.randint(3, 12)
            traj = Trajectory("p", "1", [rng.randrange(5, 400) for _ in range(rng.randint(4, 9))])
            traj.response_ids = [rng.randrange(5, 400) for _ in range(n)]
            traj.loss_mask = [0 if 3 <= i < 5 else 1 for i in range(n)]  # a "tool turn" inside
            traj.logprobs = [-rng.random() for _ in range(n)]
            traj.reward = rewards[t]
            rows.append(Row(traj, adv, g))
    return rows


def main(model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    world = D.init_world("cpu")
    model = D.shard(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), world)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = LambdaLR(opt, lambda s: 1.0)
    rows = fixed_rows()
    mine = [r for r in rows if r.group % world.size == world.rank]
    # two mini-batches: the second one runs off-policy, so the clipped ratio and recomputed old
    # logprobs are part of what must agree
    stats = update_on_rollouts(
        Learner(model, opt, sched, world),
        mine,
        rows[0].trajectory,
        RLConfig(
            model={"path": model_dir},
            data={"train": "-"},
            optim=OptimSection(mini_batches=2, micro_batch_tokens=40),
        ),
        pad_id=0,
        compute="fp32",
    )
    weights = D.full_state_dict(model, world)
    if world.main:
        torch.save({"weights": {k: v.detach().cpu() for k, v in weights.items()}, "stats": stats}, out)
    D.close(world)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

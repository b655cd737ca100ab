"""Seconds per RL step: rstar2's trainer vs TRL's GRPOTrainer, same tiny model, batch and lengths.

One step = sample G completions for each of P prompts, reward them, one optimizer update (GRPO,
no KL, clip 0.2/0.28, token-mean loss). Both sides start from the same saved tiny model and
tokenizer, get the same prompt ids, sample at temperature 1, and use the same reward (first
completion token even). By default the end-of-turn tokens are banned, so every completion is
exactly L tokens (equal work on both sides). With ``--mean-length N`` the model is set to end a
completion with probability 1/N at every token (lengths as uneven as RL responses, cut at L):
then what each framework does with rows that finished early, and with padding, shows.
rstar2 runs plain GRPO here (RoC off) so both train on the same P·G completions. The first step of
each is a warm-up and is not counted. TRL comes from the `bench` extra (`pip install -e .[bench]`).

    python benchmarks/rl_step.py [--prompts 8] [--group 8] [--length 64] [--steps 4] [--out results.json]
    python benchmarks/rl_step.py --length 256 --mean-length 48
    python benchmarks/rl_step.py --model runs/smollm2/model-init   # a real model (49K vocabulary)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from rstar2.chat.format import ChatFormat
from rstar2.chat.prompt import SYSTEM_PROMPT
from rstar2.config_files import parse_config
from rstar2.recipe.tiny_model import build_model, build_tokenizer, save_pretrained
from rstar2.rl.trainer import RLTrainer

BANNED = ["<|im_end|>", "<|endoftext|>"]


def first_token_even(traj) -> float:
    return float(bool(traj.response_ids) and traj.response_ids[0] % 2 == 0)


def stop_at_rate(model, eos_id: int, p: float) -> None:
    """Make the model end a completion with probability ~p at every token, whatever it read, so that
    lengths vary as RL responses do (geometric, mean ~1/p, cut at the length limit): every input
    embedding gets a constant feature in hidden dimension 0, which survives the final norm as
    ~sqrt(hidden); an untied output layer reads it only in the end token's row."""
    emb = model.get_input_embeddings().weight
    vocab, hidden = emb.shape
    with torch.no_grad():
        emb[:, 0] = 1.0
        head = emb.detach().clone()
        head[:, 0] = 0.0
        bias = math.log((vocab - 1) * p / (1 - p))  # e^b / (e^b + vocab - 1) = p with other logits ~0
        head[eos_id, 0] = bias / math.sqrt(hidden)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(head)


def build(
    root: Path, hidden: int, layers: int, problems: int, mean_length: int, model_dir: Path | None = None
) -> tuple[Path, Path, list[str]]:
    """The model (built here, or ``model_dir`` as it is), the problems file and the prompt texts."""
    if model_dir is None:
        tok = build_tokenizer(
            [SYSTEM_PROMPT, "print(sum(range(10)))", "<reason> 1 + 2 = 3 </reason>"] * 50, 512
        )
        model = build_model(tok, hidden=hidden, layers=layers, heads=4, mlp=4 * hidden, max_positions=2048)
        if mean_length:
            stop_at_rate(model, tok.eos_token_id, 1.0 / mean_length)
        model_dir = save_pretrained(model, tok, root / "model")
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
    rows = [{"problem": f"What is {i} + {2 * i}?", "answer": str(3 * i)} for i in range(problems)]
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fmt = ChatFormat(tok, system_prompt="Answer.", tools_in_prompt=False)
    texts = [fmt.decode(fmt.prompt_ids(r["problem"])) for r in rows]
    return model_dir, data, texts


def run_rstar2(model_dir: Path, data: Path, out: Path, a, compute: str = "auto") -> dict:
    cfg = parse_config(
        {
            "kind": "rl",
            "model": {"path": str(model_dir), "compute": compute},
            "data": {"train": str(data), "shuffle": False},
            "rollout": {
                "samples": a.group,
                "max_turns": 1,
                "max_response_tokens": a.length,
                "system_prompt": "Answer.",
                "tools_in_prompt": False,
                "banned_tokens": [] if a.mean_length else BANNED,
                "sandbox_workers": 1,
                "verifier_workers": 1,
            },
            "roc": {"enabled": False, "keep": a.group},
            "optim": {"lr": 1e-5, "warmup_steps": 0}
            | ({"micro_batch_tokens": a.micro_batch_tokens} if a.micro_batch_tokens else {}),
            "run": {
                "out": str(out),
                "steps": a.steps,
                "batch_size": a.prompts,
                "save_every": 10_000,
                "tensorboard": False,
                "progress": False,
            },
        }
    )
    trainer = RLTrainer(cfg, reward_fn=first_token_even)
    trainer.save = lambda metrics=None: None  # time steps, not checkpoints (TRL saves none either)
    history = asyncio.run(trainer.train())
    steps = [m["time/step_s"] for m in history[1:]]
    return {
        "step_s": statistics.median(steps),
        "steps_s": steps,
        "rollout_s": statistics.median(m["time/rollout_s"] for m in history[1:]),
        "update_s": statistics.median(m["time/update_s"] for m in history[1:]),
        "completion_tokens": statistics.mean(m["response/length_mean"] for m in history),
    }


def run_trl(model_dir: Path, texts: list[str], out: Path, a) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    banned = [tok.convert_tokens_to_ids(t) for t in BANNED]
    lengths: list[int] = []

    def reward(prompts, completions, completion_ids=None, **kw):
        ids = completion_ids or [tok.encode(c, add_special_tokens=False) for c in completions]
        lengths.extend(len(x) for x in ids)
        return [float(bool(x) and x[0] % 2 == 0) for x in ids]

    class Clock(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    clock = Clock()
    args = GRPOConfig(
        output_dir=str(out),
        use_cpu=not torch.cuda.is_available(),
        per_device_train_batch_size=a.prompts * a.group,
        num_generations=a.group,
        steps_per_generation=1,
        max_completion_length=a.length,
        temperature=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=a.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        shuffle_dataset=False,
        generation_kwargs={} if a.mean_length else {"suppress_tokens": banned},
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": t} for t in texts]),
        processing_class=tok,
        callbacks=[clock],
    )
    trainer.train()
    steps = clock.times[1:]
    return {
        "step_s": statistics.median(steps),
        "steps_s": steps,
        "completion_tokens": statistics.mean(lengths),
    }


def engines_before_after(model_dir: Path, data: Path, root: Path, a) -> None:
    """The same RL steps with the engine of ``a.baseline_rev`` and with the current one, A-B-B-A."""
    import gc

    import rstar2.engines.hf as hf

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from rollout import baseline_engine_class

    old = baseline_engine_class(a.baseline_rev)

    class Baseline(old):  # type: ignore[misc, valid-type]
        def __init__(
            self, model, *, keep_tokens=None, compute="auto", **kw
        ):  # the old engine keeps no prefixes
            super().__init__(model, **kw)

    engines = {"baseline": Baseline, "new": hf.HFEngine}
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    current = hf.HFEngine
    for i, name in enumerate(("baseline", "new", "new", "baseline")):
        hf.HFEngine = engines[name]  # what engines.kinds.open_engines constructs
        try:
            compute = a.new_compute if name == "new" else "auto"
            result = run_rstar2(model_dir, data, root / f"rstar2-{i}-{name}", a, compute)
        finally:
            hf.HFEngine = current
        result["rollout_tokens_per_s"] = (
            a.prompts * a.group * result["completion_tokens"] / result["rollout_s"]
        )
        runs[name].append(result)
        print(name, json.dumps(result), flush=True)
        gc.collect()

    def mean(name: str, key: str) -> float:
        return statistics.mean(r[key] for r in runs[name])

    what = f"model {a.model}" if a.model else f"tiny model (hidden {a.hidden}, {a.layers} layers)"
    print(
        f"\nRL step, {what}, {a.prompts} prompts x {a.group}, up to {a.length} tokens; engine at {a.baseline_rev} "
        f"(model.compute auto) vs now (model.compute {a.new_compute})"
    )
    print(
        f"{'engine':10}{'s/step':>9}{'rollout s':>11}{'update s':>10}{'rollout tok/s':>15}{'step ratio':>12}"
    )
    for name in engines:
        print(
            f"{name:10}{mean(name, 'step_s'):9.2f}{mean(name, 'rollout_s'):11.2f}{mean(name, 'update_s'):10.2f}"
            f"{mean(name, 'rollout_tokens_per_s'):15.1f}{mean(name, 'step_s') / mean('baseline', 'step_s'):11.2f}x"
        )
    if a.out:
        a.out.write_text(
            json.dumps({"args": vars(a) | {"out": str(a.out)}, "runs": runs}, indent=2, default=str)
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument(
        "--mean-length",
        type=int,
        default=0,
        help="0: every completion exactly --length tokens; N: completions end with probability 1/N per "
        "token (uneven lengths, cut at --length), as RL responses are",
    )
    ap.add_argument("--trl-first", action="store_true", help="run TRL first (check for drift of the machine)")
    ap.add_argument("--model", type=Path, default=None, help="a local model folder instead of the tiny one")
    ap.add_argument(
        "--baseline-rev",
        default=None,
        help="instead of TRL: rstar2's step with the in-process engine of this commit against the current "
        "engine, A-B-B-A in one process (benchmarks/rollout.py loads that engine)",
    )
    ap.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=None,
        help="rstar2's update in micro-batches of this many tokens (a 49K vocabulary's logits of 64 "
        "sequences need ~20 GB at once)",
    )
    ap.add_argument(
        "--new-compute",
        default="auto",
        choices=["auto", "bf16", "fp32"],
        help="with --baseline-rev: model.compute of the current side (the baseline runs as it was, auto)",
    )
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rl-step-"))
    if a.model is not None and a.mean_length:
        ap.error("--mean-length shapes the tiny model built here; it cannot be used with --model")
    model_dir, data, texts = build(
        root, a.hidden, a.layers, a.prompts * (a.steps + 1), a.mean_length, a.model
    )
    if a.baseline_rev:
        engines_before_after(model_dir, data, root, a)
        return
    if a.trl_first:
        theirs = run_trl(model_dir, texts, root / "trl", a)
        ours = run_rstar2(model_dir, data, root / "rstar2", a)
    else:
        ours = run_rstar2(model_dir, data, root / "rstar2", a)
        theirs = run_trl(model_dir, texts, root / "trl", a)
    ratio = ours["step_s"] / theirs["step_s"]
    what = f"model {a.model}" if a.model else f"tiny model (hidden {a.hidden}, {a.layers} layers)"
    print(
        f"\nRL step, {what}, {a.prompts} prompts x {a.group}, "
        f"{a.length} tokens, median of {a.steps - 1} steps after a warm-up, torch threads {torch.get_num_threads()}"
    )
    print(f"{'':22}{'s/step':>9}{'tokens/completion':>19}")
    print(
        f"{'rstar2 RLTrainer':22}{ours['step_s']:9.2f}{ours['completion_tokens']:19.1f}"
        f"   (rollout {ours['rollout_s']:.2f} s, update {ours['update_s']:.2f} s)"
    )
    print(f"{'TRL GRPOTrainer':22}{theirs['step_s']:9.2f}{theirs['completion_tokens']:19.1f}")
    print(f"rstar2 / TRL time per step: {ratio:.2f}x")
    if a.out:
        a.out.write_text(
            json.dumps(
                {"args": vars(a) | {"out": str(a.out)}, "rstar2": ours, "trl": theirs, "ratio": ratio},
                indent=2,
                default=str,
            )
        )


if __name__ == "__main__":
    main()

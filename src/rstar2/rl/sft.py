"""Supervised fine-tuning on chat data with tool calls (JSON Lines of OpenAI-style ``messages``).
Each conversation is tokenized turn by turn exactly as a rollout builds it, so SFT and RL see the
same token sequences; the loss is the token mean of the cross-entropy over assistant tokens only."""

from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path
from typing import Any

from ..chat.format import ChatFormat
from ..config import SFTConfig
from ..jsonl import iter_jsonl
from ..memory import resident_gib, trim_heap
from .algorithm.batch import Batch, collate, take_rows, with_weights
from .optim import Learner, accumulate, finish_step, start_step
from .passes import forward_logprobs, logprobs_of, plan
from .run import distributed as D
from .run.data import DataStream
from .run.launch import begin, load_training, run_steps


def read_conversations(path: str | Path) -> list[list[dict[str, Any]]]:
    rows = []
    for n, row in iter_jsonl(path):
        msgs = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(msgs, list) or not msgs:
            raise ValueError(f"{path}:{n}: each line needs a non-empty 'messages' list")
        rows.append(msgs)
    return rows


def sft_batch(examples: list[tuple[list[int], list[int]]], pad_id: int, units: float | None = None) -> Batch:
    """Right-padded rows weighted by mask / the whole batch's assistant tokens (``units``: all ranks')."""
    rows = [(ids[:1], ids[1:], mask[1:], [0.0] * (len(ids) - 1)) for ids, mask in examples]
    return with_weights(collate(rows, [0.0] * len(rows), [0] * len(rows), pad_id), "token-mean", units)


def sft_step(
    learner: Learner, batch: Batch, max_tokens: int, grad_clip: float, compute: str = "auto"
) -> dict:
    """Cross-entropy on assistant tokens, token mean over the whole batch (``batch.weights``)."""
    sums = start_step(learner)
    for rows in plan(batch, max_tokens, learner.world):
        mb = take_rows(batch, rows)
        # SFT learns the plain distribution (temperature 1), not the rollouts' sampling one
        logp, _ = forward_logprobs(learner.model, mb, compute=compute, temperature=1.0)
        accumulate(-(logp * mb.weights).sum(), {}, sums, learner.world)
    return finish_step(learner, sums, grad_clip)


def exact_probability(learner: Learner, probe: Batch, max_tokens: int, compute: str) -> float:
    """The mean probability of each probe conversation's assistant tokens: the chance of writing it
    word for word at T = 1. Unlike the loss, it does not average a wrong digit away."""
    learner.model.eval()
    logp = logprobs_of(learner.model, probe, max_tokens, learner.world, compute, temperature=1.0)
    return float((logp * probe.mask).sum(dim=1).exp().mean())


class SFTTrainer:
    def __init__(self, cfg: SFTConfig, *, resume: bool = False):
        self.cfg, self.resume = cfg, resume
        self.step_no = 0

    def _load(self) -> None:
        cfg = self.cfg
        start = begin(cfg, self.resume)
        self.world, self.tokenizer = start.world, start.tokenizer
        fmt = ChatFormat.from_settings(self.tokenizer, cfg.chat)
        encoded = [fmt.conversation_ids(m) for m in read_conversations(cfg.data.train)[: cfg.data.limit]]
        examples = [e for e in encoded if len(e[0]) <= cfg.sft.max_length]
        self.dropped = len(encoded) - len(examples)
        if not examples:
            raise ValueError(
                f"no SFT example fits sft.max_length={cfg.sft.max_length} ({self.dropped} dropped)"
            )
        probe = [fmt.conversation_ids(m) for m in read_conversations(cfg.sft.probe)] if cfg.sft.probe else []
        pad = self.tokenizer.pad_token_id or 0
        self.probe = sft_batch(probe, pad).to(self.world.device) if probe else None
        if cfg.sft.epochs is not None:
            self.total = max(1, math.ceil(cfg.sft.epochs * len(examples) / cfg.run.batch_size))
        else:
            self.total = cfg.run.steps
        self.run = run = load_training(cfg, start, self.total)
        self.cfg, self.step_no = run.cfg, run.step
        self.data = DataStream(examples, cfg.run.seed, cfg.data.shuffle, run.data_position)

    def train(self) -> list[dict[str, Any]]:
        self._load()
        history: list[dict[str, Any]] = []
        self.recent: deque[float] = deque(maxlen=self.cfg.sft.stop_window)
        self.stopped_early = False
        with run_steps("SFT", self.cfg, self.run, self.total) as steps:
            while self.step_no < self.total:
                steps.begin(self.step_no + 1)
                m = self._step()
                history.append(m)
                self.stopped_early = self._stop(m)
                if steps.done(self.step_no, loss=f"{m['loss']:.4f}") or self.stopped_early:
                    self.run.save(self.step_no, {"data_position": self.data.position, "metrics": m})
                if self.stopped_early:
                    break
        return history

    def _step(self) -> dict[str, Any]:
        """One optimizer step on the next ``run.batch_size`` examples (this process's share), logged."""
        cfg, world = self.cfg, self.world
        t0 = time.perf_counter()
        chunk = self.data.take(cfg.run.batch_size)
        share = chunk[world.rank :: world.size]  # this process's examples
        units, tokens = D.all_sum(
            [float(sum(sum(m[1:]) for _, m in share)), float(sum(len(ids) for ids, _ in share))], world
        )
        batch = sft_batch(share or chunk[:1], self.tokenizer.pad_token_id or 0, units).to(world.device)
        if not share:
            batch.weights.zero_()  # a stand-in row: this process still joins the collectives
        tokens_max, compute = cfg.optim.micro_batch_tokens, cfg.model.compute
        m = sft_step(self.run.learner, batch, tokens_max, cfg.optim.grad_clip, compute)
        trim_heap()  # the step's logits and activations, freed: else each step's shapes grow the heap
        self.step_no += 1
        seconds = time.perf_counter() - t0
        m.update({"tokens_per_s": tokens / seconds, "time/step_s": seconds, **resident_gib()})
        if self.step_no == 1:
            m["examples"], m["examples_dropped"] = float(len(self.data.rows)), float(self.dropped)
        if self.probe is not None and self.step_no % cfg.sft.probe_every == 0:
            m["probe/exact"] = exact_probability(self.run.learner, self.probe, tokens_max, compute)
        self.run.log.log(self.step_no, m)
        return m

    def _stop(self, m: dict[str, Any]) -> bool:
        """Stop early: the recent mean loss under ``sft.stop_loss``, or the probe at ``sft.stop_skill``."""
        sft, recent = self.cfg.sft, self.recent
        recent.append(m["loss"])
        if sft.stop_loss is not None and len(recent) == recent.maxlen:
            if sum(recent) / len(recent) < sft.stop_loss:
                return True
        return sft.stop_skill is not None and m.get("probe/exact", 0.0) >= sft.stop_skill

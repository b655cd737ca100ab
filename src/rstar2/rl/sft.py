"""Supervised fine-tuning on chat data with tool calls: the recipe's non-reasoning SFT stage.

Examples are JSON Lines with ``messages`` (system / user / assistant / tool, OpenAI style).
Each conversation is tokenized turn by turn exactly as a rollout builds it
(``ChatFormat.conversation_ids``), so SFT and RL see the same token sequences; the loss is the
token mean of the cross-entropy over assistant tokens only (tool output and prompts are context).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from ..config import SFTConfig, dump_config
from . import distributed as D
from .batch import Batch, take_rows
from .checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint
from .data import ProblemStream
from .metrics_log import MetricsLog
from .optim import build_optimizer
from .update import forward_logprobs, plan


def read_conversations(path: str | Path) -> list[list[dict[str, Any]]]:
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
        msgs = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(msgs, list) or not msgs:
            raise ValueError(f"{path}:{n}: each line needs a non-empty 'messages' list")
        rows.append(msgs)
    return rows


def sft_batch(examples: list[tuple[list[int], list[int]]], pad_id: int, units: float | None = None) -> Batch:
    """Right-padded rows; weights = mask / (assistant tokens of the whole batch)."""
    width = max(len(ids) for ids, _ in examples)
    rows = len(examples)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    mask = torch.zeros((rows, width - 1))
    for i, (ids, m) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        mask[i, : len(ids) - 1] = torch.tensor(m[1:], dtype=torch.float32)
    total = float(mask.sum()) if units is None else units
    zeros = torch.zeros_like(mask)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        labels=input_ids[:, 1:].clone(),
        mask=mask,
        advantages=zeros,
        engine_logp=zeros,
        group_index=torch.zeros(rows, dtype=torch.long),
        weights=mask / total if total > 0 else zeros,
    )


def sft_step(
    model, optimizer, scheduler, batch: Batch, max_tokens: int, grad_clip: float, world: D.World
) -> dict:
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for rows in plan(batch, max_tokens, world):
        mb = take_rows(batch, rows)
        logp, _ = forward_logprobs(model, mb)
        loss = -(logp * mb.weights).sum()
        (loss * world.size).backward()
        loss_sum += float(loss.detach())
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    optimizer.step()
    scheduler.step()
    return {"loss": D.all_sum([loss_sum], world)[0], "grad_norm": norm, "lr": scheduler.get_last_lr()[0]}


class SFTTrainer:
    def __init__(self, cfg: SFTConfig, *, resume: bool = False):
        self.cfg, self.resume = cfg, resume
        self.run_dir = Path(cfg.run.out)
        self.step_no = 0

    def _load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from ..chat.format import ChatFormat

        cfg = self.cfg
        if cfg.model.threads:
            torch.set_num_threads(cfg.model.threads)
        self.world = D.init_world(cfg.model.device)
        torch.manual_seed(cfg.run.seed)
        ckpt = latest_checkpoint(self.run_dir) if self.resume else None
        start = str(ckpt or cfg.run.init_from or cfg.model.path)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer or start)
        extra = {} if cfg.system_prompt is None else {"system_prompt": cfg.system_prompt}
        fmt = ChatFormat(self.tokenizer, stateful=cfg.stateful, tools_in_prompt=cfg.tools_in_prompt, **extra)
        examples, self.dropped = [], 0
        for msgs in read_conversations(cfg.data.train)[: cfg.data.limit]:
            ids, mask = fmt.conversation_ids(msgs)
            if len(ids) > cfg.sft.max_length:
                self.dropped += 1
                continue
            examples.append((ids, mask))
        if not examples:
            raise ValueError(
                f"no SFT example fits sft.max_length={cfg.sft.max_length} ({self.dropped} dropped)"
            )
        if cfg.sft.epochs is not None:
            self.total = max(1, math.ceil(cfg.sft.epochs * len(examples) / cfg.run.batch_size))
        else:
            self.total = cfg.run.steps
        dtype = torch.float32 if cfg.model.dtype == "auto" else getattr(torch, cfg.model.dtype)
        model = AutoModelForCausalLM.from_pretrained(start, dtype=dtype).to(self.world.device)
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.model = D.shard(model, self.world)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim, self.total)
        position = 0
        if ckpt is not None:
            state = load_trainer_state(ckpt, self.model, self.optimizer, self.scheduler, self.world)
            self.step_no, position = int(state["step"]), int(state.get("data_position", 0))
        self.data = ProblemStream(examples, cfg.run.seed, cfg.data.shuffle, position)
        self.log = MetricsLog(
            self.run_dir, tensorboard=cfg.run.tensorboard, enabled=self.world.main, resume_step=self.step_no
        )
        if self.world.main:
            (self.run_dir / "config.yaml").write_text(dump_config(cfg))

    def train(self) -> list[dict[str, Any]]:
        self._load()
        cfg, world = self.cfg, self.world
        pad = self.tokenizer.pad_token_id or 0
        bar = None
        if cfg.run.progress and world.main:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.total, initial=self.step_no, desc="sft steps", unit="step")
        history = []
        try:
            while self.step_no < self.total:
                t0 = time.perf_counter()
                chunk = self.data.take(cfg.run.batch_size)
                mine = chunk[world.rank :: world.size] or chunk[:1]
                units = D.all_sum(
                    [float(sum(sum(m[1:]) for _, m in chunk[world.rank :: world.size]))], world
                )[0]
                batch = sft_batch(mine, pad, units).to(world.device)
                if not chunk[world.rank :: world.size]:
                    batch.weights.zero_()  # a stand-in row: this process still joins the collectives
                m = sft_step(
                    self.model,
                    self.optimizer,
                    self.scheduler,
                    batch,
                    cfg.optim.micro_batch_tokens,
                    cfg.optim.grad_clip,
                    world,
                )
                self.step_no += 1
                tokens = D.all_sum(
                    [float(sum(len(ids) for ids, _ in chunk[world.rank :: world.size]))], world
                )[0]
                m.update(
                    {
                        "tokens_per_s": tokens / (time.perf_counter() - t0),
                        "time/step_s": time.perf_counter() - t0,
                    }
                )
                if self.step_no == 1:
                    m["examples"], m["examples_dropped"] = float(len(self.data.rows)), float(self.dropped)
                self.log.log(self.step_no, m)
                history.append(m)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{m['loss']:.4f}")
                if self.step_no == self.total or self.step_no % max(1, cfg.run.save_every) == 0:
                    save_checkpoint(
                        self.run_dir,
                        self.step_no,
                        self.model,
                        self.optimizer,
                        self.scheduler,
                        self.tokenizer,
                        {"data_position": self.data.position, "metrics": m},
                        world,
                        keep=cfg.run.keep_checkpoints,
                    )
        finally:
            if bar is not None:
                bar.close()
            self.log.close()
            D.close(world)
        return history

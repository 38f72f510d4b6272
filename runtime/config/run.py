"""Typed, validated experiment config: the boundary between ml_collections and library code."""

import dataclasses
import difflib
import importlib.util
import math
import typing
from typing import Any, Sequence

import ml_collections

from models.config import ModelConfig, presets
from runtime.config import capacity as capacity_lib, data as data_config
from runtime.config.data import DataConfig
from runtime.cluster import learner_slices
from runtime.data import manifest as data_manifest
from runtime.config import fragment_plan
from runtime.errors import ConfigError, check, check_types, every_error
from runtime.config import faults as faults_config
from runtime.config.faults import FaultConfig, parse_schedule
from runtime.config import network as links_config
from runtime.wire import config as wire_config

MODES = ("decoupled", "diloco_sync", "dp", "dp_elastic", "dp_restart")
CHECKPOINT_MODES = ("dp", "decoupled", "diloco_sync")  # modes a killed run resumes from its checkpoints in
CLOCKS = ("virtual", "real")
# "pathways": pathwaysutils.initialize() before JAX starts (runtime/cluster/multislice.py); "ray": each learner in
# a Ray actor of its own (runtime/diloco/learner/ray_learner.py)
BACKENDS = ("local", "pathways", "ray")
GRACE_KINDS = ("none", "adaptive", "fixed")
MERGE_METHODS = ("rda", "mean")  # per tensor: radial-directional averaging, or the weighted mean
RECEIVE_MODES = ("carry", "overwrite", "mix")  # what happens to overlap steps when Θ arrives
OUTER_GRAD_BASES = ("current", "base")
OUTER_SCALES = ("fraction", "none")
# The outer step's rule (runtime/diloco/sync/outer_rules.py): one momentum step per merge; one per round's worth of
# merges with plain steps between (Liu et al. 2024); or the momentum decaying by momentum^(n/M) per merge of n of M
OUTER_RULES = ("nesterov", "delayed_nesterov", "momentum_per_round")
ROUND_LENGTHS = ("steps", "time")
POSITIONS = ("rotary", "learned")
DTYPES = ("float32", "bfloat16")
HOST_TRANSFERS = ("auto", "pinned", "copy")  # reports and Θ to and from the host: tree_transfer.py, `route`
# Fields that change nothing a run computes (its records and results): they are not part of a run's name, and a run
# resumes whatever they are now.
QUIET_FIELDS = ("progress", "tensorboard", "compile_cache", "backend", "ray.address", "ray.hang_seconds",
                "ray.hang_factor", "ray.processes_per_learner", "checkpoint_every", "checkpoint_seconds",
                "checkpoint_wall_seconds", "checkpoint_keep", "checkpoint_learner_state", "resume", "save_model_every",
                "host_transfers")
# Fields a run resumes under whatever they are now: the quiet ones, and when it evaluates, what it logs and how many
# batches its loader prepares ahead. Every other field changes the training, and a changed one is refused on resume.
RESUMABLE_FIELDS = (*QUIET_FIELDS, "eval_every", "log_every", "data.prefetch")
# Paths a run is compared by what they hold, not where it lies: a moved dataset resumes (runtime/data/corpus.py).
CONTENT_FIELDS = ("data.path",)


@dataclasses.dataclass(frozen=True)
class InnerOptConfig:
  """Inner AdamW with linear warmup and cosine decay."""

  lr: float = 3e-3
  warmup_steps: int = 20
  min_lr_ratio: float = 0.1
  weight_decay: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  grad_clip: float = 1.0
  # Where a DiLoCo learner's schedule stands: "learner" (its own inner steps) or "run" (the run's progress: global
  # batches' worth of tokens dispatched by all learners, set at each dispatch; learners that join later or a
  # membership that grows keep to the run's schedule).
  schedule_progress: str = "learner"


@dataclasses.dataclass(frozen=True)
class OuterConfig:
  """Syncer: outer Nesterov SGD, quorum, screening, merge rule, grace window, redistribution."""

  lr: float = 0.7
  momentum: float = 0.9
  nesterov: bool = True
  rule: str = "nesterov"  # one of OUTER_RULES: how a merge's outer gradient moves Θ and the momentum
  quorum: int = 1
  merge: str = "rda"
  embed_mean: bool = True  # embeddings use the plain weighted mean under RDA
  token_weighting: bool = True
  outer_grad_base: str = "current"  # Δ_m = Θ_current − θ_m, or Θ_base(m) − θ_m
  scale: str = "fraction"  # "fraction": a merge of n of M learners scales the outer gradient by n/M; "none"
  grace: str = "adaptive"
  grace_gamma: float = 1.0
  grace_seconds: float = 0.0  # for grace == "fixed"
  ema_decay: float = 0.9  # moving averages behind the adaptive grace window
  receive: str = "carry"  # "carry": θ ← Θ + overlap progress; "mix": θ ← (1−α)·Θ + α·θ; "overwrite": θ ← Θ
  mix_alpha: float = 0.5  # receive == "mix": θ ← (1−α)·Θ + α·θ_local
  keep_training: bool = False  # after its τ overlap steps, a learner still without Θ trains τ more (kept)
  quarantine_factor: float = 100.0  # a delta norm above this × the recent norm is quarantined
  max_delta_norm: float = 1e6  # ... and so is any delta norm above this
  max_update_ratio: float = 100.0  # an outer step above this × the merged deltas' norm is never committed
  divergence_merges: int = 8  # this many merges in a row that commit nothing end the run (diverged)
  # A diagnostic: a merge of n reports goes through the rule as n merges of one (1/M of a round each), all
  # measured from the Θ it began with, so K=M shows what partial merges cost a rule without any staleness
  merge_one_by_one: bool = False


@dataclasses.dataclass(frozen=True)
class ClockConfig:
  """Time model: real wall time, or a seeded virtual clock for reproducible asynchrony."""

  kind: str = "virtual"
  step_seconds: float = 1.0  # virtual seconds per inner step at speed 1
  speeds: tuple[float, ...] = ()  # per-learner slowdown factors; empty = all 1
  jitter: float = 0.0  # relative std of per-round step-time noise
  bandwidth_bytes_per_s: float = 1e9  # learner <-> syncer link, each way
  latency_s: float = 0.0
  merge_seconds: float = 0.0  # virtual cost of one merge on the syncer


@dataclasses.dataclass(frozen=True)
class RoundsConfig:
  """How long a learner's round is (runtime/diloco/round_plan.py)."""

  # "steps": H inner steps for every learner; "time": until the syncs' deadlines, one every H × the slowest learner's
  # step time, so fast learners take more steps and the reports of a deadline arrive together
  length: str = "steps"


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """How a learner's slice (DP: every device) is laid out: (data, tensor)."""

  tensor: int = 1  # tensor-parallel width inside a slice; the slice's other devices split the batch (and, fsdp, state)


@dataclasses.dataclass(frozen=True)
class RayConfig:
  """backend "ray": the cluster its learners' actors run on."""

  address: str = ""  # "": a local cluster started for the run (none running); "auto" or "host:port": join that one
  # Under the real clock a learner that does not answer by its deadline is hung: its process is killed and it
  # crashes. A call's deadline is hang_seconds (hang_factor times that for a call that compiles); a part's is
  # hang_seconds + hang_factor x its expected time (its steps, and those ahead of it, at its last step rate).
  hang_seconds: float = 120.0
  hang_factor: float = 10.0
  # A learner of several processes (a gang), joined by jax.distributed, each holding an equal share of its slice's
  # devices; one member's death ends the gang, which is replaced as a unit. Local cluster only (ray.address "").
  processes_per_learner: int = 1


@dataclasses.dataclass(frozen=True)
class SyncerConfig:
  """Where the syncer's state lives (its algorithm is `outer`)."""

  shards: int = 1  # host CPU devices Θ's tensors are split across, each merging its share (sync/shards.py)


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Everything one training run needs."""

  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  inner: InnerOptConfig = dataclasses.field(default_factory=InnerOptConfig)
  outer: OuterConfig = dataclasses.field(default_factory=OuterConfig)
  clock: ClockConfig = dataclasses.field(default_factory=ClockConfig)
  rounds: RoundsConfig = dataclasses.field(default_factory=RoundsConfig)
  faults: FaultConfig = dataclasses.field(default_factory=FaultConfig)
  capacity: capacity_lib.CapacityConfig = dataclasses.field(default_factory=capacity_lib.CapacityConfig)
  compression: wire_config.CompressionConfig = dataclasses.field(default_factory=wire_config.CompressionConfig)
  links: links_config.LinksConfig = dataclasses.field(default_factory=links_config.LinksConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  syncer: SyncerConfig = dataclasses.field(default_factory=SyncerConfig)
  ray: RayConfig = dataclasses.field(default_factory=RayConfig)
  mode: str = "decoupled"
  seed: int = 0
  num_devices: int = 8  # simulated CPU devices (ignored on real accelerators)
  backend: str = "local"  # one of BACKENDS
  learners: int = 4
  slices: int = 0  # 0 = slices_per_learner slices per learner; more leaves spare slices
  slices_per_learner: int = 1  # k: a learner's round runs data-parallel over k slices (cluster/learner_slices.py)
  share_devices: bool = False  # fewer devices than slices: the slices take one device each, round-robin
  inner_steps: int = 30  # H
  overlap_steps: int = 0  # τ: inner steps a learner keeps training while its report syncs
  profile_rounds: int = 0  # rounds of every learner traced with jax.profiler into <run>/profile/; 0 = none
  parts_in_flight: int = 0  # programs a learner keeps queued on its slices (0 = 2 under the real clock, else 1)
  fragments: int = 1  # P: each report carries one of P fragments of the model (runtime/config/fragment_plan.py)
  total_steps: int = 300  # per-learner inner steps at full global batch; fixes the token budget
  # > 0: the token budget in tokens per model parameter; total_steps is then derived (see with_budget)
  tokens_per_param: float = 0.0
  eval_every: int = 50  # inner steps between evals (DP) / per learner (DiLoCo: rounded to rounds)
  eval_batches: int = 8
  eval_batch_size: int = 0  # sequences per held-out batch; 0 = data.batch_size / learners (the set depends on M)
  log_every: int = 10
  fsdp: bool = False  # shard parameters along the slice's data axis
  progress: bool = True
  tensorboard: bool = True
  compile_cache: str = "~/.cache/decoupled-diloco/xla"  # persistent XLA compilation cache; "" = off
  # how reports and Θ cross between the learners' devices and the syncer's host: "pinned" (through the devices'
  # pinned host memory, where they have it), "copy", or "auto" (pinned on accelerators, copy on CPU devices);
  # runtime/train/tree_transfer.py, `route`; run.json says which one a run took
  host_transfers: str = "auto"
  checkpoint_every: int = 0  # steps (dp) or merges (decoupled, diloco_sync) between checkpoints; 0 = none
  checkpoint_seconds: float = 0.0  # decoupled, diloco_sync: also checkpoint at a merge this long after the last
  # also checkpoint at a merge (dp: a step) this many wall seconds (the host's, whatever the run's clock) after the
  # last; 0 = none. Any of the three on also saves a final checkpoint
  checkpoint_wall_seconds: float = 0.0
  checkpoint_keep: int = 3  # newest checkpoints kept
  # decoupled, diloco_sync: whether a checkpoint holds each learner's inner state (parameters, AdamW moments, the
  # round in flight); False: Θ and the run's bookkeeping only, and a resume restarts every learner from Θ, its work
  # not merged written off (dp saves its one model's state whatever this is)
  checkpoint_learner_state: bool = True
  save_model_every: int = 0  # decoupled, diloco_sync: also save the model every this many merges; 0 = only at the end
  resume: bool = True  # the workdir holds this run: resume it; False: start afresh in a new run directory

  @property
  def tokens_per_step(self) -> int:
    """Tokens the whole job trains on per inner step (global batch × sequence length)."""
    return self.data.batch_size * self.data.seq_len

  @property
  def checkpoints(self) -> bool:
    """Whether the run saves checkpoints, and so resumes from them: dp by checkpoint_every or
    checkpoint_wall_seconds, decoupled and diloco_sync by those or checkpoint_seconds."""
    return self.mode in CHECKPOINT_MODES and bool(self.checkpoint_every or self.checkpoint_wall_seconds
                                                  or (self.checkpoint_seconds and self.mode != "dp"))

  @property
  def eval_batch(self) -> int:
    """Sequences per held-out batch: eval_batch_size, or one learner's share of the global batch."""
    return self.eval_batch_size or max(self.data.batch_size // max(self.learners, 1), 1)

  @property
  def round_steps(self) -> int:
    """A DiLoCo learner's inner steps per round (between two reports): H, or H/P with P fragments."""
    return self.inner_steps // self.fragments

  @property
  def token_budget(self) -> int:
    """Training tokens the run consumes, the same for every mode."""
    return self.total_steps * self.tokens_per_step

  def learner_batch(self, m: int) -> int:
    """Learner m's batch size (sequences per inner step)."""
    return self.data.learner_batches[m] if self.data.learner_batches else self.data.batch_size // self.learners

  @property
  def num_slices(self) -> int:
    """The slices the run owns (learners' and spares); lent slices come on top."""
    return self.slices or (1 if self.mode == "dp" else self.learners * self.slices_per_learner)

  @property
  def lent_slices(self) -> int:
    """The most slices the capacity schedule lends at once (each runs one more learner)."""
    return capacity_lib.most_lent(self.capacity.schedule)


def with_fields(run: RunConfig, fields: dict[str, Any]) -> RunConfig:
  """`run` with dotted fields replaced ({"outer.quorum": 8, "seed": 1}), validated."""
  sections: dict[str, dict[str, Any]] = {}
  top = {}
  for path, value in fields.items():
    section, _, name = path.rpartition(".")
    target = sections.setdefault(section, {}) if section else top
    owner = getattr(run, section) if section else run
    if not dataclasses.is_dataclass(owner) or name not in {f.name for f in dataclasses.fields(owner)}:
      raise ConfigError(path, value, f"a field of {type(owner).__name__}")
    parse = {"faults.schedule": parse_schedule, "capacity.schedule": capacity_lib.parse}.get(path)
    target[name] = parse(value) if parse and isinstance(value, str) else value
  if "data.path" in fields and "model.vocab_size" not in fields:  # other data: its vocabulary
    sections.setdefault("model", {})["vocab_size"] = data_manifest.vocabulary(fields["data.path"])[0]
  nested = {s: dataclasses.replace(getattr(run, s), **v) for s, v in sections.items()}
  run = with_budget(dataclasses.replace(run, **top, **nested))
  validate(run)
  return run


def with_budget(run: RunConfig) -> RunConfig:
  """`run` with total_steps derived from tokens_per_param when that is set: the whole rounds of H inner steps at the
  global batch whose tokens come nearest tokens_per_param × the model's parameters (at least one round), the same in
  every mode, so that DiLoCo's last round is a full one."""
  if not (0 < run.tokens_per_param < math.inf and run.inner_steps >= 1 and run.tokens_per_step >= 1):
    return run  # no budget in tokens per parameter, or fields validate() names
  try:
    rounds = round(run.tokens_per_param * run.model.num_params() / (run.tokens_per_step * run.inner_steps))
  except (ArithmeticError, ValueError):  # a model field validate() names (num_heads 0, ...)
    return run
  return dataclasses.replace(run, total_steps=max(int(rounds), 1) * run.inner_steps)


# Fields that moved or were renamed: the error for the old name says where they went (the new name, then how its
# values read, if they changed).
MOVED = {"faults.quarantine_factor": "outer.quarantine_factor", "faults.max_delta_norm": "outer.max_delta_norm",
         "faults.checkpoint_every": "faults.restart_checkpoint_every",
         "outer.momentum_per": "outer.rule ('merge' is 'nesterov', 'round' is 'momentum_per_round')"}


def _tuple(field: dataclasses.Field, name: str, value: Any) -> tuple:
  """A tuple field's value as a tuple of its element type; '(1, 2)' or '1,2' given as text is parsed."""
  element = (typing.get_args(field.type) or (str,))[0]
  items = value if isinstance(value, Sequence) and not isinstance(value, str) else (value,)
  if len(items) == 1 and isinstance(items[0], str) and element is not str:  # a literal config_flags left as text
    items = [part for part in items[0].strip().strip("()[]").split(",") if part.strip()]
  try:
    parsed = tuple(_element(element, item) for item in items)
  except (TypeError, ValueError, OverflowError):
    raise ConfigError(name, value, f"a tuple of {element.__name__}s, e.g. '(1, 2)'") from None
  check(element is not float or all(math.isfinite(x) for x in parsed), name, value, "a tuple of finite numbers")
  return parsed


def _element(element: type, item: Any) -> Any:
  """`item` as `element`; an int must be integral ('2' and 2.0 are, 2.5 is not)."""
  if element is int:
    number = float(item)
    if number != int(number):
      raise ValueError(item)
    return int(number)
  return element(item)


def _build(cls: type, cfg: ml_collections.ConfigDict | None, prefix: str) -> Any:
  """Builds a frozen dataclass, rejecting unknown fields and coercing sequences to typed tuples."""
  fields = {f.name: f for f in dataclasses.fields(cls)}
  values = {}
  for key, value in (cfg.to_dict() if cfg is not None else {}).items():
    if key not in fields:
      moved = MOVED.get(f"{prefix}{key}")
      close = difflib.get_close_matches(key, fields, n=1)
      new, _, how = (moved or "").partition(" ")
      raise ConfigError(f"{prefix}{key}", value, f"only under its new name '{new}'" + (f" {how}" if how else "")
                        if moved else
                        (f"(unknown field; did you mean '{prefix}{close[0]}'?) " if close else "") +
                        f"one of the fields {sorted(fields)}")
    is_tuple = typing.get_origin(fields[key].type) is tuple and key != "schedule"
    values[key] = _tuple(fields[key], f"{prefix}{key}", value) if is_tuple else value
  if cls is FaultConfig and isinstance(values.get("schedule"), str):
    values["schedule"] = parse_schedule(values["schedule"])
  if cls is capacity_lib.CapacityConfig and isinstance(values.get("schedule"), str):
    values["schedule"] = capacity_lib.parse(values["schedule"])
  return cls(**values)


def _build_model(cfg: ml_collections.ConfigDict | None, data_path: str) -> ModelConfig:
  """ModelConfig from an optional `size` preset plus explicit field overrides; the vocabulary, unless set, data's."""
  fields = {k: v for k, v in (cfg.to_dict() if cfg is not None else {}).items() if v is not None}  # None: preset
  size = fields.pop("size", None)
  sizes = presets(fields.get("kind", "gpt"))
  if size is not None and size not in sizes:
    raise ConfigError("model.size", size, f"one of {sorted(sizes)} (of model.kind {fields.get('kind', 'gpt')!r})")
  fields.setdefault("vocab_size", data_manifest.vocabulary(data_path)[0])
  return _build(ModelConfig, ml_collections.ConfigDict({**sizes.get(size, {}), **fields}), "model.")


SECTIONS = dict(model=ModelConfig, data=DataConfig, inner=InnerOptConfig, outer=OuterConfig, clock=ClockConfig,
                rounds=RoundsConfig, faults=FaultConfig, capacity=capacity_lib.CapacityConfig,
                compression=wire_config.CompressionConfig,
                links=links_config.LinksConfig, mesh=MeshConfig, syncer=SyncerConfig, ray=RayConfig)


def from_config_dict(cfg: ml_collections.ConfigDict) -> RunConfig:
  """Converts and validates a ConfigDict; every error names the field and the allowed values."""
  nested = {name: _build(cls, cfg.get(name), f"{name}.") for name, cls in SECTIONS.items() if name != "model"}
  nested["model"] = _build_model(cfg.get("model"), nested["data"].path)
  top = ml_collections.ConfigDict({k: v for k, v in cfg.items() if k not in SECTIONS})
  return with_mode(with_budget(dataclasses.replace(_build(RunConfig, top, ""), **nested)), top.get("mode", "decoupled"))


def with_mode(run: RunConfig, mode: str) -> RunConfig:
  """The run in `mode`, validated; synchronous DiLoCo waits for every learner (K = M, no grace)."""
  check(mode in MODES, "mode", mode, f"one of {MODES}")
  run = dataclasses.replace(run, mode=mode)
  if mode == "diloco_sync":
    run = dataclasses.replace(run, outer=dataclasses.replace(run.outer, quorum=run.learners, grace="none"))
  validate(run)
  return run


def validate(run: RunConfig) -> None:
  """Raises ConfigError naming every field outside what it allows (ConfigErrors when there are several)."""
  with every_error():
    _validate(run)


def _validate_model(m: ModelConfig) -> None:
  """The model's kind and the fields that depend on it."""
  if not m.builtin():  # imports JAX and the user's module: only when one is named
    try:
      importlib.import_module("models.interface").spec_of(m.kind)
    except ValueError as error:
      raise ConfigError("model.kind", m.kind, str(error)) from None
  check(m.kind != "llama" or m.positions == "rotary", "model.positions", m.positions,
        "'rotary' for model.kind 'llama'")
  check(m.num_kv_heads >= 0 and (m.num_kv_heads == 0 or m.num_heads % m.num_kv_heads == 0), "model.num_kv_heads",
        m.num_kv_heads, f"0 (= num_heads) or a divisor of model.num_heads ({m.num_heads})")
  check(m.kind == "llama" or m.num_kv_heads in (0, m.num_heads), "model.num_kv_heads", m.num_kv_heads,
        f"0 for model.kind {m.kind!r} (grouped-query attention is llama's)")
  check(m.kind == "llama" or m.tied_embeddings, "model.tied_embeddings", m.tied_embeddings,
        f"True for model.kind {m.kind!r} (only llama unties its output projection)")


def _validate_ray(run: RunConfig) -> None:
  """What the Ray backend has built so far (runtime/diloco/learner/ray_learner.py); each other setting named."""
  check(importlib.util.find_spec("ray") is not None, "backend", run.backend,
        "'local' unless Ray is installed (the `ray` extra: pip install -e '.[ray]')")
  why = "with backend 'ray' (not built for it yet)"
  check(run.mode in ("decoupled", "diloco_sync"), "mode", run.mode, f"'decoupled' or 'diloco_sync' {why}")
  gang = run.ray.processes_per_learner
  per_slice = run.num_devices // max(run.num_slices + run.lent_slices, 1)
  check(gang == 1 or (gang > 1 and per_slice % gang == 0 and per_slice >= gang), "ray.processes_per_learner", gang,
        f"an integer >= 1 that splits each learner's slice evenly (num_devices {run.num_devices} / slices "
        f"{run.num_slices + run.lent_slices}, lent included: {per_slice} devices each, divisible by it)")
  check(gang == 1 or run.slices_per_learner == 1, "ray.processes_per_learner", gang,
        f"1 with slices_per_learner {run.slices_per_learner} (a learner of several slices that loses one moves its "
        "state onto fewer processes' devices: JAX on CPU moves no array between processes)")
  check(gang == 1 or (not run.fsdp and run.mesh.tensor == 1), "ray.processes_per_learner", gang,
        f"1 with fsdp {run.fsdp} and mesh.tensor {run.mesh.tensor} (a gang's member reads a report from the "
        "parameters it holds whole: replicated over the slice, fsdp False and mesh.tensor 1)")
  check(gang == 1 or not run.ray.address, "ray.processes_per_learner", gang,
        f"1 with ray.address {run.ray.address!r} (a gang's processes on several hosts are not built: local "
        "cluster only)")


def _validate(run: RunConfig) -> None:
  m, d, i, o, c = run.model, run.data, run.inner, run.outer, run.clock
  check_types(run, "")
  for name in SECTIONS:
    check_types(getattr(run, name), f"{name}.")
  check(run.mode in MODES, "mode", run.mode, f"one of {MODES}")
  check(0 <= run.seed < 2**32, "seed", run.seed, "an integer in [0, 2**32)")
  check(run.num_devices >= 1, "num_devices", run.num_devices, "an integer >= 1")
  check(run.backend in BACKENDS, "backend", run.backend, f"one of {BACKENDS}")
  check(run.host_transfers in HOST_TRANSFERS, "host_transfers", run.host_transfers, f"one of {HOST_TRANSFERS}")
  check(run.backend != "pathways" or importlib.util.find_spec("pathwaysutils") is not None, "backend", run.backend,
        "'local' unless pathwaysutils is installed (the `pathways` extra: pip install -e '.[pathways]')")
  check(run.learners >= 1, "learners", run.learners, "an integer >= 1")
  if run.backend == "ray":
    _validate_ray(run)
  check(not run.ray.address or run.backend == "ray", "ray.address", run.ray.address,
        "'' unless backend is 'ray' (the cluster its learners' actors run on)")
  check(run.ray.hang_seconds > 0, "ray.hang_seconds", run.ray.hang_seconds, "a number of seconds > 0")
  check(run.ray.hang_factor >= 1, "ray.hang_factor", run.ray.hang_factor, "a number >= 1")
  check(run.ray.processes_per_learner == 1 or run.backend == "ray", "ray.processes_per_learner",
        run.ray.processes_per_learner, "1 unless backend is 'ray'")
  if run.mode != "dp":
    check(run.learners <= run.num_devices or run.share_devices, "learners", run.learners, f"at most num_devices "
          f"({run.num_devices}): each learner needs a slice of at least one device (raise num_devices, use fewer "
          "learners, or set share_devices=True to let slices share devices)")
  learner_slices.validate(run)
  check(run.slices == 0 or run.learners <= run.slices <= run.num_devices, "slices", run.slices,
         f"0 (one per learner) or from learners ({run.learners}) to num_devices ({run.num_devices})")
  check(run.inner_steps >= 1, "inner_steps", run.inner_steps, "an integer >= 1")
  check(run.profile_rounds >= 0, "profile_rounds", run.profile_rounds, "a whole number of rounds >= 0 (0: no trace)")
  check(run.parts_in_flight in (0, 1, 2), "parts_in_flight", run.parts_in_flight, "0 (by the clock), 1 or 2")
  check(0 <= run.overlap_steps < run.inner_steps, "overlap_steps", run.overlap_steps,
         f"0 <= overlap_steps < inner_steps ({run.inner_steps})")
  check(run.total_steps >= 1, "total_steps", run.total_steps, "an integer >= 1")
  check(run.eval_every >= 1, "eval_every", run.eval_every, "an integer >= 1")
  check(run.eval_batches >= 1, "eval_batches", run.eval_batches, "an integer >= 1")
  check(run.eval_batch_size >= 0, "eval_batch_size", run.eval_batch_size,
        "an integer >= 0 (0: data.batch_size / learners)")
  check(not run.tokens_per_param < 0, "tokens_per_param",  # NaN and infinity: the finite-number check
        run.tokens_per_param, "a number >= 0 (0: total_steps sets the budget)")
  check(run.log_every >= 1, "log_every", run.log_every, "an integer >= 1")
  check(run.checkpoint_every >= 0, "checkpoint_every", run.checkpoint_every, "an integer >= 0 (0 = no checkpoints)")
  check(run.checkpoint_every == 0 or run.mode in CHECKPOINT_MODES, "checkpoint_every", run.checkpoint_every,
        f"0 in mode '{run.mode}': runs resume from checkpoints in modes {CHECKPOINT_MODES} (dp_restart checkpoints "
        "by faults.restart_checkpoint_every)")
  check(run.checkpoint_seconds >= 0, "checkpoint_seconds", run.checkpoint_seconds, "a number >= 0 (0 = none)")
  check(run.checkpoint_seconds == 0 or run.mode in CHECKPOINT_MODES[1:], "checkpoint_seconds",
        run.checkpoint_seconds, f"0 in mode '{run.mode}': allowed in modes {CHECKPOINT_MODES[1:]}")
  check(run.checkpoint_wall_seconds >= 0, "checkpoint_wall_seconds", run.checkpoint_wall_seconds,
        "a number >= 0 (0 = none)")
  check(run.checkpoint_keep >= 1, "checkpoint_keep", run.checkpoint_keep, "an integer >= 1")
  check(run.save_model_every >= 0 and (run.save_model_every == 0 or run.mode in CHECKPOINT_MODES[1:]),
        "save_model_every", run.save_model_every, f"0, or merges >= 1 in modes {CHECKPOINT_MODES[1:]}")
  _validate_model(m)
  check(m.positions in POSITIONS, "model.positions", m.positions, f"one of {POSITIONS}")
  check(m.dtype in DTYPES, "model.dtype", m.dtype, f"one of {DTYPES}")
  for name in ("num_layers", "d_model", "num_heads", "mlp_dim", "max_len"):
    check(getattr(m, name) >= 1, f"model.{name}", getattr(m, name), "an integer >= 1")
  check(m.num_heads < 1 or (m.d_model % m.num_heads == 0 and (m.d_model // m.num_heads) % 2 == 0), "model.num_heads",
        m.num_heads, f"a divisor of model.d_model ({m.d_model}) leaving an even head size")
  data_config.validate(run)
  capacity_lib.validate(run)
  check(run.rounds.length in ROUND_LENGTHS, "rounds.length", run.rounds.length, f"one of {ROUND_LENGTHS}")
  check(run.rounds.length == "steps" or (run.fragments == 1 and not run.capacity.schedule), "rounds.length",
        run.rounds.length, "'steps' while fragments > 1 or capacity.schedule lends slices (not built for 'time' yet)")
  groups = run.learners if run.mode in ("decoupled", "diloco_sync", "dp_elastic", "dp_restart") else 1
  shared = run.share_devices and run.num_devices < run.num_slices + run.lent_slices
  per_slice = 1 if shared else run.num_devices // max(run.num_slices + run.lent_slices, 1)
  check(d.batch_size >= 1 and (bool(d.learner_batches) or d.batch_size % groups == 0), "data.batch_size",
        d.batch_size, f"a positive multiple of learners ({groups}), or data.learner_batches summing to it")
  if run.mode == "dp":  # one mesh over every device
    check(d.batch_size % run.num_devices == 0, "data.batch_size", d.batch_size,
           f"a multiple of num_devices ({run.num_devices})")
  else:
    check(not shared or run.mode in ("decoupled", "diloco_sync"), "share_devices", run.share_devices,
          f"False in mode '{run.mode}' with fewer devices ({run.num_devices}) than slices: slices share devices in "
          "modes decoupled and diloco_sync")
    if shared:
      check((run.num_slices + run.lent_slices) % run.num_devices == 0, "num_devices", run.num_devices,
            f"a divisor of the number of slices ({run.num_slices} owned + {run.lent_slices} lent at most) when "
            "share_devices puts several slices on one device")
    else:
      check(run.num_devices % (run.num_slices + run.lent_slices) == 0, "num_devices", run.num_devices,
            f"a multiple of the number of slices ({run.num_slices} owned + {run.lent_slices} lent at most)")
    if d.learner_batches:
      check(len(d.learner_batches) == run.learners and sum(d.learner_batches) == d.batch_size
            and all(b > 0 and b % (per_slice * run.slices_per_learner) == 0 for b in d.learner_batches),
            "data.learner_batches", d.learner_batches, f"one batch size per learner ({run.learners}), each a positive "
            f"multiple of the devices per learner ({per_slice * run.slices_per_learner}), summing to data.batch_size "
            f"({d.batch_size})")
    else:
      check((d.batch_size // groups) % (per_slice * run.slices_per_learner) == 0, "data.batch_size", d.batch_size,
            f"a multiple of learners × devices per learner ({groups} × {per_slice * run.slices_per_learner})")
  width = run.num_devices if run.mode == "dp" else per_slice
  check(run.mesh.tensor >= 1 and width % run.mesh.tensor == 0, "mesh.tensor", run.mesh.tensor,
        f"a divisor of the devices per slice ({width}{' in mode dp: every device' if run.mode == 'dp' else ''})")
  check(run.syncer.shards >= 1 and (run.syncer.shards == 1 or run.mode != "dp"), "syncer.shards",
        run.syncer.shards, "an integer >= 1 (1 in mode dp, which has no syncer)")
  check(i.lr > 0, "inner.lr", i.lr, "a float > 0")
  check(0 <= i.warmup_steps, "inner.warmup_steps", i.warmup_steps, "an integer >= 0")
  check(0 <= i.min_lr_ratio <= 1, "inner.min_lr_ratio", i.min_lr_ratio, "a float in [0, 1]")
  check(i.weight_decay >= 0, "inner.weight_decay", i.weight_decay, "a float >= 0")
  check(0 <= i.b1 < 1 and 0 <= i.b2 < 1, "inner.b1/inner.b2", (i.b1, i.b2), "floats in [0, 1)")
  check(i.grad_clip > 0, "inner.grad_clip", i.grad_clip, "a float > 0")
  check(i.schedule_progress in ("learner", "run"), "inner.schedule_progress", i.schedule_progress,
        "one of ('learner', 'run')")
  check(o.lr > 0, "outer.lr", o.lr, "a float > 0")
  check(0 <= o.momentum < 1, "outer.momentum", o.momentum, "a float in [0, 1)")
  check(o.rule in OUTER_RULES, "outer.rule", o.rule, f"one of {OUTER_RULES}")
  check(1 <= o.quorum <= run.learners, "outer.quorum", o.quorum, f"an integer in [1, learners={run.learners}]")
  check(o.merge in MERGE_METHODS, "outer.merge", o.merge, f"one of {MERGE_METHODS}")
  check(o.outer_grad_base in OUTER_GRAD_BASES, "outer.outer_grad_base", o.outer_grad_base,
         f"one of {OUTER_GRAD_BASES}")
  check(o.scale in OUTER_SCALES, "outer.scale", o.scale, f"one of {OUTER_SCALES}")
  check(o.grace in GRACE_KINDS, "outer.grace", o.grace, f"one of {GRACE_KINDS}")
  check(0 <= o.grace_gamma <= 1, "outer.grace_gamma", o.grace_gamma, "a float in [0, 1]")
  check(o.grace_seconds >= 0, "outer.grace_seconds", o.grace_seconds, "a float >= 0")
  check(0 <= o.ema_decay < 1, "outer.ema_decay", o.ema_decay, "a float in [0, 1)")
  check(o.receive in RECEIVE_MODES, "outer.receive", o.receive, f"one of {RECEIVE_MODES}")
  check(0 < o.mix_alpha < 1 or (o.receive != "mix" and o.mix_alpha == 0), "outer.mix_alpha", o.mix_alpha,
        "a float in (0, 1)")
  check(not o.keep_training or (o.receive != "overwrite" and run.overlap_steps > 0), "outer.keep_training",
        o.keep_training, "False unless overlap_steps > 0 and outer.receive keeps the overlap work ('carry' or 'mix')")
  check(c.kind in CLOCKS, "clock.kind", c.kind, f"one of {CLOCKS}")
  check(c.step_seconds > 0, "clock.step_seconds", c.step_seconds, "a float > 0")
  check(not c.speeds or len(c.speeds) == run.learners, "clock.speeds", c.speeds,
         f"empty or one factor per learner ({run.learners})")
  check(all(s > 0 for s in c.speeds), "clock.speeds", c.speeds, "positive slowdown factors")
  check(0 <= c.jitter < 1, "clock.jitter", c.jitter, "a float in [0, 1)")
  check(c.bandwidth_bytes_per_s > 0, "clock.bandwidth_bytes_per_s", c.bandwidth_bytes_per_s, "a float > 0")
  check(o.quarantine_factor > 1, "outer.quarantine_factor", o.quarantine_factor, "a float > 1")
  check(o.max_delta_norm > 0, "outer.max_delta_norm", o.max_delta_norm, "a float > 0")
  check(o.max_update_ratio > 0, "outer.max_update_ratio", o.max_update_ratio, "a float > 0")
  check(o.divergence_merges >= 1, "outer.divergence_merges", o.divergence_merges, "an integer >= 1")
  faults_config.validate(run)
  wire_config.validate(run), links_config.validate(run), fragment_plan.validate(run)
  check(c.latency_s >= 0 and c.merge_seconds >= 0, "clock.latency_s/clock.merge_seconds",
         (c.latency_s, c.merge_seconds), "floats >= 0")

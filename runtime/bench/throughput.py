"""Steady-state throughput benchmarks: launcher DP vs a hand-written loop, and Decoupled DiLoCo vs DP.

Each benchmark alternates its contenders in one process (the order flips every repeat, so drift in the
shared machine's load hits all alike) and reports every repeat and median ratios. Compilation and
evaluation are excluded: DP is timed from its training records after the first steps, Decoupled DiLoCo
from its merge records after every learner's first rounds, hand-written loops after untimed warm-up.
decoupled_vs_dp also runs the learners' own round programs by hand, one loop per slice with no syncer:
the rate the controller could at best reach on this machine, which splits the gap to DP into the cost
of the runtime and the cost of running M smaller programs instead of one.
"""

import collections
import dataclasses
import os
import statistics
import time
from typing import Callable

import jax
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from models import lm
from runtime.cluster import devices as devices_lib
from runtime.config.run import RunConfig, with_mode
from runtime.errors import ConfigError
from runtime.train.harness import Experiment
from runtime.train.optim import inner_optimizer
from runtime.config.faults import FaultConfig
from runtime.experiments.modes import prepare, train_one
from runtime.reporting.summary import summary_table
from runtime.train.programs import TrainState, init_state, make_round

BENCHMARKS = ("dp_overhead", "decoupled_vs_dp")
TARGET = 0.95  # each ratio should reach this
# Steps the hand loop lets queue up: with 40 queued 8-device programs, XLA:CPU's all-reduce rendezvous
# deadlocked here (queued launches hold the client's threads); the launcher keeps at most two in flight.
_MAX_IN_FLIGHT = 10


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  """Which benchmarks to run, how often, and how long each contender trains."""

  which: str = "all"  # one of BENCHMARKS, or "all"
  repeats: int = 3  # runs of each contender; the median ratio is reported
  dp_steps: int = 60  # launcher DP steps per run
  skip_steps: int = 10  # DP steps not timed (compilation); the hand loop runs as many untimed
  hand_steps: int = 40  # hand-loop steps timed after the untimed ones
  diloco_steps: int = 180  # DiLoCo token budget in global-batch steps (M=4, H=30: 6 rounds per learner)
  skip_rounds: int = 2  # each learner's first rounds not timed (compilation, first merges' compilation)
  hand_rounds: int = 4  # rounds per learner timed in the hand-written learner loops (after one untimed)

  def __post_init__(self) -> None:
    if self.which not in (*BENCHMARKS, "all"):
      raise ConfigError("which", self.which, f"one of {(*BENCHMARKS, 'all')}")
    for name in ("repeats", "hand_steps", "skip_rounds", "hand_rounds"):
      if getattr(self, name) < 1:
        raise ConfigError(name, getattr(self, name), "an integer >= 1")
    if self.skip_steps < 1 or self.dp_steps <= self.skip_steps:
      raise ConfigError("dp_steps", self.dp_steps, f"more than skip_steps ({self.skip_steps}), itself >= 1")


# Steady-state rates from run records ------------------------------------------------------------


def dp_tokens_per_second(records: list[dict], skip_steps: int) -> float:
  """Tokens/s between the first training record at or after `skip_steps` and the next-to-last one.

  The last record is excluded because the final evaluation runs before it is logged.
  """
  train = [r for r in records if r["kind"] == "train" and r["step"] >= skip_steps][:-1]
  if len(train) < 2:
    raise ValueError(f"{len(train)} timed DP records: raise dp_steps")
  first, last = train[0], train[-1]
  return (last["tokens"] - first["tokens"]) / (last["wall"] - first["wall"])


def diloco_tokens_per_second(records: list[dict], skip_rounds: int) -> float:
  """Merged tokens per wall second between two merges of one learner, with every learner warm.

  The window opens at the merge that brings the last learner to `skip_rounds` merged reports and closes
  at that same learner's last merge before the drain (the first learner to run out of budget), so it
  spans whole rounds of that learner and the rest are in the same phase at both ends.
  """
  merges = [r for r in records if r["kind"] == "merge" and r["merged"]]
  counts: collections.Counter = collections.Counter()
  warm_at: dict[int, int] = {}
  last_at: dict[int, int] = {}
  for i, record in enumerate(merges):
    for m in record["merged"]:
      counts[m] += 1
      if counts[m] == skip_rounds:
        warm_at[m] = i
      last_at[m] = i
  if len(warm_at) < len(last_at):
    raise ValueError(f"a learner reported fewer than skip_rounds={skip_rounds} times: raise diloco_steps")
  start = max(warm_at.values())
  ref = next(m for m, i in warm_at.items() if i == start)
  drain = min(last_at.values())
  end = max((i for i in range(start + 1, drain + 1) if ref in merges[i]["merged"]), default=None)
  if end is None:
    raise ValueError("no full round between warm-up and drain: raise diloco_steps")
  first, last = merges[start], merges[end]
  return (last["tokens"] - first["tokens"]) / (last["wall"] - first["wall"])


# Contenders ------------------------------------------------------------------------------------


def _replica(run: RunConfig, mesh: jax.sharding.Mesh, tx: optax.GradientTransformation) -> TrainState:
  """Fresh parameters and inner optimizer state on `mesh`, laid out as the runtime lays them out."""
  params = jax.jit(lm.init_params, static_argnums=0, out_shardings=lm.param_shardings(run.model, mesh, run.fsdp))(
      run.model, jax.random.key(run.seed))
  return jax.jit(lambda p: init_state(p, tx))(params)  # one program, so the optimizer state joins the mesh


def hand_dp_tokens_per_second(run: RunConfig, exp: Experiment, warmup: int, steps: int) -> float:
  """A minimal jitted DP loop on the launcher's mesh, model, optimizer and batches; no metrics."""
  mesh = devices_lib.slice_mesh(devices_lib.controller_devices(run.num_devices))
  tx = inner_optimizer(run.inner, run.total_steps)
  batch_sh = NamedSharding(mesh, P("data"))
  state = _replica(run, mesh, tx)
  state_sh = jax.tree.map(lambda x: x.sharding, state)

  def train_step(state: TrainState, batch_BxT: jax.Array) -> tuple[TrainState, jax.Array]:
    (_, loss), grads = jax.value_and_grad(lm.train_loss, has_aux=True)(state.params, run.model, batch_BxT)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return state.replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state), loss

  step = jax.jit(train_step, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, None), donate_argnums=0)
  stream = exp.shard(0, 1, run.data.batch_size)
  batches = [jax.device_put(next(stream), batch_sh) for _ in range(warmup + steps)]
  for batch in batches[:warmup]:
    state, loss = step(state, batch)
  jax.block_until_ready(state)
  start = time.perf_counter()
  pending = None
  for i, batch in enumerate(batches[warmup:]):
    state, loss = step(state, batch)  # the loss is only a completion token
    if pending is not None:  # waits one step late, so the device always has the next step queued
      pending.block_until_ready()
      pending = None
    if i % _MAX_IN_FLIGHT == _MAX_IN_FLIGHT - 1:
      pending = loss
  jax.block_until_ready(state)
  return steps * run.tokens_per_step / (time.perf_counter() - start)


def hand_learners_tokens_per_second(run: RunConfig, exp: Experiment, rounds: int) -> float:
  """The learners' round programs run by hand: one loop per slice, no syncer, reports or controller.

  Each learner runs the runtime's round program (H inner steps, one dispatch) on its own slice, shard
  and per-learner batch, with two rounds in flight so a slice never waits on the host. One untimed
  round per learner compiles; `rounds` more per learner are timed.
  """
  m = run.learners
  slices = devices_lib.make_slices(devices_lib.controller_devices(run.num_devices), run.num_slices)[:m]
  tx = inner_optimizer(run.inner, run.total_steps)
  round_fn = jax.jit(make_round(run.model, tx), donate_argnums=0)
  states, batches = [], []
  for i, devices in enumerate(slices):
    mesh = devices_lib.slice_mesh(devices)
    stream = exp.shard(i, m, run.data.batch_size // m)
    rounds_RxHxBxT = [np.stack([next(stream) for _ in range(run.inner_steps)]) for _ in range(1 + rounds)]
    batches.append([jax.device_put(b, NamedSharding(mesh, P(None, "data"))) for b in rounds_RxHxBxT])
    states.append(_replica(run, mesh, tx))
  for i in range(m):
    states[i], _ = round_fn(states[i], batches[i][0])
  jax.block_until_ready(states)
  start = time.perf_counter()
  in_flight = [collections.deque() for _ in range(m)]  # each learner's unfinished rounds (their losses)
  for r in range(1, 1 + rounds):
    for i in range(m):
      if len(in_flight[i]) == 2:
        in_flight[i].popleft().block_until_ready()
      states[i], metrics = round_fn(states[i], batches[i][r])
      in_flight[i].append(metrics["loss"])
  jax.block_until_ready(states)
  return rounds * run.inner_steps * run.tokens_per_step / (time.perf_counter() - start)  # M learners, B/M each


def launcher_dp_tokens_per_second(run: RunConfig, exp: Experiment, skip_steps: int) -> float:
  """`runtime.baselines.dp.train_dp` through the launcher's entry point, timed from its records."""
  return dp_tokens_per_second(train_one(run, exp, None, "dp").records, skip_steps)


def decoupled_tokens_per_second(run: RunConfig, exp: Experiment, skip_rounds: int) -> float:
  """Real-clock Decoupled DiLoCo through the launcher's entry point, timed from its merge records."""
  return diloco_tokens_per_second(train_one(run, exp, None, "decoupled").records, skip_rounds)


# Running and reporting ---------------------------------------------------------------------------


def alternate(contenders: dict[str, Callable[[], float]], repeats: int) -> list[dict[str, float]]:
  """Tokens/s of each contender per repeat; the order flips every repeat so load drift hits both.

  Each row also holds the host's 1-minute load average after the repeat: other processes on a shared
  host take cores from both contenders unevenly, and a ratio taken under load says less.
  """
  names = list(contenders)
  rows = []
  for r in range(repeats):
    row = {}
    for name in names if r % 2 == 0 else names[::-1]:
      row[name] = contenders[name]()
    row["load"] = os.getloadavg()[0]
    rows.append(row)
  return rows


def format_result(title: str, rows: list[dict[str, float]], numerator: str, denominator: str,
                  target: float | None = TARGET) -> tuple[str, float]:
  """A table of tokens/s per repeat with their ratio, the median ratio (against `target`), and that median."""
  ratios = [row[numerator] / row[denominator] for row in rows]
  table_rows = [{"repeat": i + 1, f"{numerator} tok/s": round(row[numerator]),
                 f"{denominator} tok/s": round(row[denominator]), "ratio": ratio, "host load": row["load"]}
                for i, (row, ratio) in enumerate(zip(rows, ratios))]
  median = statistics.median(ratios)
  table = summary_table(table_rows, list(table_rows[0]), title=title)
  text = f"{table}\nmedian ratio {numerator}/{denominator} = {median:.3f}"
  if target is not None:
    text += f" ({'meets' if median >= target else 'misses'} the target >= {target})"
  return text, median


def run(config: ml_collections.ConfigDict, bench: BenchConfig) -> dict[str, float]:
  """Runs the chosen benchmarks on `config`'s model, batch and devices; prints and returns median ratios."""
  base = prepare(config)
  base = dataclasses.replace(base, progress=False, tensorboard=False, faults=FaultConfig())
  exp = Experiment(base)
  dp = with_mode(dataclasses.replace(base, total_steps=bench.dp_steps, eval_every=bench.dp_steps + 1), "dp")
  medians = {}

  def emit(name: str, title: str, rows: list[dict[str, float]], numerator: str, denominator: str,
           target: float | None = TARGET) -> None:
    text, medians[name] = format_result(f"{name}: {title}", rows, numerator, denominator, target=target)
    print(text, flush=True)

  if bench.which in ("dp_overhead", "all"):
    rows = alternate({
        "launcher": lambda: launcher_dp_tokens_per_second(dp, exp, bench.skip_steps),
        "hand": lambda: hand_dp_tokens_per_second(dp, exp, bench.skip_steps, bench.hand_steps),
    }, bench.repeats)
    emit("dp_overhead", f"runtime.baselines.dp.train_dp ({bench.dp_steps} steps, timed from step "
         f"{bench.skip_steps}) vs a hand-written jitted loop ({bench.hand_steps} steps after {bench.skip_steps}); "
         f"{dp.num_devices} devices, global batch {dp.data.batch_size}, "
         f"model d={dp.model.d_model} x {dp.model.num_layers} layers", rows, "launcher", "hand")
  if bench.which in ("decoupled_vs_dp", "all"):
    decoupled = with_mode(dataclasses.replace(
        base, total_steps=bench.diloco_steps, eval_every=bench.diloco_steps + 1,
        clock=dataclasses.replace(base.clock, kind="real")), "decoupled")
    rows = alternate({
        "decoupled": lambda: decoupled_tokens_per_second(decoupled, exp, bench.skip_rounds),
        "learners": lambda: hand_learners_tokens_per_second(decoupled, exp, bench.hand_rounds),
        "dp": lambda: launcher_dp_tokens_per_second(dp, exp, bench.skip_steps),
    }, bench.repeats)
    devices = len(devices_lib.controller_devices(decoupled.num_devices))
    emit("decoupled_vs_dp", f"real-clock Decoupled DiLoCo (M={decoupled.learners}, K={decoupled.outer.quorum}, "
         f"H={decoupled.inner_steps}, τ={decoupled.overlap_steps}, receive={decoupled.outer.receive}, keep_training="
         f"{decoupled.outer.keep_training}, {bench.diloco_steps} steps, first {bench.skip_rounds} rounds per learner "
         f"and the drain untimed) vs DP ({bench.dp_steps} steps, timed from step {bench.skip_steps}); "
         f"{devices} devices, global batch {decoupled.data.batch_size}", rows, "decoupled", "dp")
    # The same repeats, split: what the learners' programs alone reach, and the runtime's share of that.
    emit("learners_vs_dp", f"the learners' round programs by hand ({decoupled.learners} loops, one per "
         f"{devices // decoupled.num_slices}-device slice, batch "
         f"{decoupled.data.batch_size // decoupled.learners} each, {bench.hand_rounds} rounds of "
         f"{decoupled.inner_steps} steps timed, no syncer) vs DP: what these devices allow M learners",
         rows, "learners", "dp", target=None)
    emit("decoupled_vs_learners", "the runtime's share of what its learners' programs allow", rows, "decoupled",
         "learners", target=None)
  return medians

"""A learner: one slice's mesh, data shard, parameters and inner AdamW state, and its round program."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from models import lm
from runtime import data as data_lib
from runtime import devices as devices_lib
from runtime import faults as faults_lib
from runtime.config import RunConfig
from runtime.train_step import TrainState, init_state, make_round

PyTree = Any

TRAINING, WAITING, DOWN, DONE = "training", "waiting", "down", "done"


@dataclasses.dataclass
class Segment:
  """A dispatched run of inner steps: its futures and what it consumed."""

  kind: str  # "main": ends in a report; "overlap": trains while the report syncs
  steps: int
  tokens: int
  started_at: float
  modeled_seconds: float
  state: TrainState
  metrics: dict


@dataclasses.dataclass(frozen=True)
class Delivery:
  """Θ on its way to a learner, and how to adopt it."""

  version: int
  params: PyTree
  cycle: int  # the learner's cycle this answers; a learner that moved on ignores it
  reset: bool = False  # fresh inner state (rejoin, quarantined report)
  rewind_to: dict | None = None  # serve the data from here again (its earlier work never reached Θ)


class Learner:
  """Owns one slice; all device work is dispatched asynchronously and awaited only in `collect`."""

  def __init__(self, index: int, slice_index: int, devices: list[jax.Device], run: RunConfig,
               stream: data_lib.ShardIterator, tx: optax.GradientTransformation,
               injector: faults_lib.Injector | None = None):
    self.index = index
    self.run = run
    self.tx = tx
    self.injector = injector
    self.stream = stream
    self.prefetcher = data_lib.Prefetcher(stream, depth=run.data.prefetch)
    self.move_to(slice_index, devices)
    self.state: TrainState | None = None
    self.status = WAITING
    self.inflight: Segment | None = None
    self.inbox: Delivery | None = None  # received but not yet adopted (the learner was busy)
    self.tokens = 0  # since Θ was last received
    self.steps = 0
    self.cycle_busy = 0.0  # busy seconds since Θ was last received
    self.cycle = 0  # counts receipts of Θ; a report and its answer carry it
    self.reported_tokens = 0  # tokens of this cycle that went into a report
    self.base_version = 0
    self.total_steps = 0  # inner steps ever trained: drives the inner schedule
    self.busy_seconds = 0.0
    self.finished_at = float("nan")
    self.last_loss = float("nan")
    self.cycle_start: dict = self.prefetcher.state()  # data position when Θ was last received
    self.reported_position: dict = self.cycle_start  # data position at the end of the last report
    self.reports_out = 0  # reports sent and not yet merged or quarantined
    self.rejoin_slice: int | None = None  # repaired slice held for a rejoin that awaits reports_out
    self.failure = ""  # the device error of a program that failed at dispatch, until its crash takes effect
    self.corrupt_next = ""  # fault injection: corrupt the next report ("nan", "inf", "huge")
    self.completions: list[tuple[float, int]] = []  # (time, inner steps) of every finished segment
    self.intervals: list[tuple[str, float, float, str]] = []
    self._state_since = 0.0

  # Placement -----------------------------------------------------------------

  def move_to(self, slice_index: int, devices: list[jax.Device]) -> None:
    """Binds the learner to a slice: its mesh, shardings and (re)compiled round program."""
    self.slice_index = slice_index
    self.devices = devices
    self.mesh = devices_lib.slice_mesh(devices)
    self.param_sharding = lm.param_shardings(self.run.model, self.mesh, self.run.fsdp)
    self.batch_sharding = NamedSharding(self.mesh, P(None, "data"))
    hook = faults_lib.device_check(self.injector, self.index, self.mesh) if self.injector else None
    self._round = jax.jit(make_round(self.run.model, self.tx, hook), donate_argnums=0)
    self._init = jax.jit(lambda p, step: init_state(p, self.tx, step))

  def reset(self, theta_host: PyTree, version: int, now: float) -> None:
    """Starts from Θ with fresh inner optimizer state (initial start, rejoin, quarantine)."""
    params = _copy_to(theta_host, self.param_sharding)
    self.state = self._init(params, self.total_steps)
    self._received(version, now)

  def receive(self, theta_host: PyTree, version: int, mix_alpha: float, now: float) -> None:
    """Adopts Θ (overwrite, or Streaming-DiLoCo mixing with the local parameters); keeps inner state."""
    theta = _copy_to(theta_host, self.param_sharding)
    if mix_alpha:
      theta = _mix(theta, self.state.params, jnp.float32(mix_alpha))
    self.state = self.state.replace(params=theta)
    self._received(version, now)

  def _received(self, version: int, now: float) -> None:
    self.cycle += 1
    self.tokens = self.steps = self.reported_tokens = 0
    self.cycle_busy = 0.0
    self.base_version = version
    self.inbox = None
    self.cycle_start = self.prefetcher.state()
    self.set_status(WAITING, now)

  def params_to_host(self, host_sharding: jax.sharding.Sharding) -> PyTree:
    """An explicit, asynchronous copy of θ_m onto the syncer's host device."""
    return _copy_to(self.state.params, host_sharding)

  # Rounds --------------------------------------------------------------------

  def dispatch(self, kind: str, steps: int, now: float, modeled_seconds: float) -> Segment:
    """Enqueues `steps` inner steps as one device program and returns at once (may raise)."""
    batches_HxBxT = np.stack([next(self.prefetcher) for _ in range(steps)])
    tokens = steps * batches_HxBxT.shape[1] * (batches_HxBxT.shape[2] - 1)
    self.set_status(TRAINING, now)
    batches_HxBxT = jax.device_put(batches_HxBxT, self.batch_sharding)
    state, metrics = self._round(self.state, batches_HxBxT)
    self.inflight = Segment(kind, steps, tokens, now, modeled_seconds, state, metrics)
    self.state = state
    return self.inflight

  def collect(self, now: float) -> Segment:
    """Awaits the in-flight segment (raising the device error if it failed) and books its work."""
    seg = self.inflight
    loss_H = np.asarray(jax.device_get(seg.metrics["loss"]))
    self.inflight = None
    busy = seg.modeled_seconds if seg.modeled_seconds else now - seg.started_at
    self.tokens += seg.tokens
    self.steps += seg.steps
    self.total_steps += seg.steps
    self.busy_seconds += busy
    if seg.kind == "main":
      self.cycle_busy += busy
    self.last_loss = float(loss_H.mean())
    self.completions.append((now, seg.steps))
    return seg

  def drop_inflight(self) -> int:
    """Forgets the in-flight segment (its slice failed); returns the tokens it had taken."""
    seg, self.inflight = self.inflight, None
    return seg.tokens if seg else 0

  def rewind(self, position: dict) -> None:
    """Resumes the data shard at `position`: work after it did not reach Θ and is trained again."""
    self.prefetcher.restore(position)

  # Bookkeeping ---------------------------------------------------------------

  def busy_fraction(self, now: float) -> float:
    """Share of the learner's active span (start to finishing its budget) spent training."""
    span = self.finished_at if self.status == DONE else now
    return self.busy_seconds / span if span > 0 else 1.0

  def set_status(self, status: str, now: float) -> None:
    """Moves to `status`, closing the timeline interval of the previous one."""
    if status == self.status == DONE:
      return
    if status == DONE:
      self.finished_at = now
    if now > self._state_since and self.status != DONE:
      self.intervals.append((f"learner {self.index}", self._state_since, now, self.status))
    self.status, self._state_since = status, now

  def close(self) -> None:
    self.prefetcher.close()


@jax.jit
def _fresh_copy(tree: PyTree) -> PyTree:
  return jax.tree.map(jnp.copy, tree)


def _copy_to(tree: PyTree, sharding: jax.sharding.Sharding) -> PyTree:
  """A transfer whose result shares no buffer with its source.

  The learner donates its buffers to each round and the syncer keeps Θ's history, so neither may
  alias the other; device_put between overlapping CPU device sets reuses the shared device's buffer
  even with may_alias=False, hence a copy program. Copies to the host run on the host's single device:
  a copy on the learner's slice queued behind the rounds dispatched before it (XLA:CPU appeared to run
  one multi-device program at a time), and the learner's report with it.
  """
  if len(jax.tree.leaves(sharding)[0].device_set) == 1:
    return _fresh_copy(jax.device_put(tree, sharding))
  return jax.device_put(_fresh_copy(tree), sharding)


@jax.jit
def _mix(theta: PyTree, local: PyTree, alpha: jax.Array) -> PyTree:
  return jax.tree.map(lambda g, l: (1 - alpha) * g + alpha * l, theta, local)

"""The syncer: global parameters Θ and the outer Nesterov optimizer on the host CPU.

Reports are screened (non-finite or absurd deltas are quarantined, never merged), weighted by
tokens, merged per tensor (RDA or mean), and applied as one outer step.
"""

import dataclasses
from typing import Any, Sequence
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax

from runtime import merge as merge_lib
from runtime.config import OuterConfig

PyTree = Any


@dataclasses.dataclass
class Report:
  """One learner's progress since it last received Θ."""

  learner: int
  params: PyTree  # θ_m, already on the host
  tokens: int  # c_tokens since the learner last received Θ
  steps: int  # c_steps since the learner last received Θ
  base_version: int  # the outer step of the Θ the learner started from
  loss: float
  sent_at: float
  data_start: dict = dataclasses.field(default_factory=dict)  # the learner's data position range
  data_end: dict = dataclasses.field(default_factory=dict)  # ... that this report trained on
  busy_seconds: float = 0.0  # slice time spent on this report's inner steps
  cycle: int = 0  # the learner's cycle it closes
  arrived_at: float = float("nan")


@dataclasses.dataclass(frozen=True)
class MergeResult:
  """What one outer step did."""

  version: int
  params: PyTree
  opt_state: PyTree
  merged: tuple[int, ...]
  quarantined: tuple[tuple[int, str], ...]
  weights: tuple[float, ...]
  staleness: tuple[int, ...]
  delta_norms: tuple[float, ...]
  update_norm: float
  tokens: int
  steps: int


def outer_optimizer(cfg: OuterConfig) -> optax.GradientTransformation:
  """SGD with (Nesterov) momentum on the outer gradient."""
  return optax.sgd(cfg.lr, momentum=cfg.momentum or None, nesterov=cfg.nesterov and cfg.momentum > 0)


class Syncer:
  """Holds Θ, its history for learners still working from old versions, and the outer optimizer."""

  def __init__(self, cfg: OuterConfig, params: PyTree, num_learners: int, quarantine_factor: float,
               max_delta_norm: float):
    self.cfg = cfg
    self.num_learners = num_learners
    self.tx = outer_optimizer(cfg)
    self.version = 0
    self.params = params
    self.opt_state = jax.jit(self.tx.init)(params)
    self._history: dict[int, PyTree] = {0: params}
    self._quarantine_factor = quarantine_factor
    self._max_delta_norm = max_delta_norm
    self._accepted_norm_ema: float | None = None
    mean_for = merge_lib.is_embedding if cfg.embed_mean else None
    tx = self.tx

    def deltas_fn(refs: Sequence[PyTree], locals_: Sequence[PyTree]) -> tuple[list[PyTree], jax.Array]:
      deltas = [jax.tree.map(jnp.subtract, r, l) for r, l in zip(refs, locals_)]
      return deltas, jnp.stack([merge_lib.global_norm(d) for d in deltas])

    def step_fn(theta: PyTree, opt_state: PyTree, deltas: Sequence[PyTree], weights: jax.Array, scale: jax.Array):
      delta = jax.tree.map(lambda d: d * scale, merge_lib.merge(deltas, weights, method=cfg.merge, mean_for=mean_for))
      updates, opt_state = tx.update(delta, opt_state, theta)
      return optax.apply_updates(theta, updates), opt_state, merge_lib.global_norm(updates)

    self._deltas = jax.jit(deltas_fn)
    self._step = jax.jit(step_fn, donate_argnums=2)  # the deltas are temporaries of this merge

  def reference(self, report: Report) -> PyTree:
    """The Θ that a report's outer gradient is measured against."""
    return self.params if self.cfg.outer_grad_base == "current" else self._history[report.base_version]

  def compute(self, reports: Sequence[Report]) -> MergeResult:
    """Screens and merges `reports` into a new Θ; pure with respect to the syncer (see commit)."""
    deltas, norms = self._deltas([self.reference(r) for r in reports], [r.params for r in reports])
    norms = np.asarray(jax.device_get(norms), np.float64)
    keep, quarantined = [], []
    for i, (report, norm) in enumerate(zip(reports, norms)):
      reason = self._screen(norm)
      if reason:
        quarantined.append((report.learner, reason))
      else:
        keep.append(i)
    version = self.version + 1
    if not keep:
      return MergeResult(version - 1, self.params, self.opt_state, (), tuple(quarantined), (), (), (), 0.0, 0, 0)
    kept = [reports[i] for i in keep]
    if self.cfg.token_weighting:
      weights = np.array([float(merge_lib.token_weight(r.tokens, r.steps)) for r in kept])
    else:
      weights = np.ones(len(kept))
    # A merge of n of M learners is n/M of a synchronous outer step (outer.scale == "fraction").
    scale = len(kept) / self.num_learners if self.cfg.scale == "fraction" else 1.0
    with warnings.catch_warnings():
      # Θ and the momentum can reuse two of the donated deltas; the others are freed early, unused.
      warnings.filterwarnings("ignore", "Some donated buffers were not usable")
      params, opt_state, update_norm = self._step(self.params, self.opt_state, [deltas[i] for i in keep],
                                                  jnp.asarray(weights, jnp.float32), jnp.float32(scale))
    return MergeResult(
        version=version, params=params, opt_state=opt_state, merged=tuple(r.learner for r in kept),
        quarantined=tuple(quarantined), weights=tuple(float(w) for w in weights),
        staleness=tuple(self.version - r.base_version for r in kept),
        delta_norms=tuple(float(norms[i]) for i in keep), update_norm=float(update_norm),
        tokens=sum(r.tokens for r in kept), steps=sum(r.steps for r in kept))

  def commit(self, result: MergeResult, live_versions: Sequence[int]) -> None:
    """Adopts a computed merge; keeps only the Θ versions some learner still works from."""
    if result.merged:
      self.params, self.opt_state, self.version = result.params, result.opt_state, result.version
      mean_norm = float(np.mean(result.delta_norms))
      ema = self._accepted_norm_ema
      self._accepted_norm_ema = mean_norm if not ema else 0.9 * ema + 0.1 * mean_norm
    self._history[self.version] = self.params
    keep = set(live_versions) | {self.version}
    self._history = {v: p for v, p in self._history.items() if v in keep}

  def _screen(self, norm: float) -> str:
    """Why a delta of this norm must not be merged, or '' if it may."""
    if not np.isfinite(norm):
      return "non-finite"
    if norm > self._max_delta_norm:
      return f"norm {norm:.3g} > max_delta_norm {self._max_delta_norm:.3g}"
    ema = self._accepted_norm_ema
    if ema and norm > self._quarantine_factor * ema:  # relative only once a typical norm is known
      return f"norm {norm:.3g} > {self._quarantine_factor:g} × recent norm {ema:.3g}"
    return ""

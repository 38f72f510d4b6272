"""The syncer: global parameters Θ, the outer optimizer, the quorum and the grace window, on the host CPU.

Reports wait until the quorum has reported (and, optionally, a grace window longer); then they are screened
(non-finite or absurd deltas are quarantined, never merged), weighted by tokens, merged per tensor (RDA or mean), and
applied as one outer step. With P > 1 fragments each fragment has its own quorum, grace window and outer-optimizer
state, and one version counter numbers every merge (docs/architecture.md, Fragments).
"""

import dataclasses
import functools
from typing import Any, Callable, Sequence
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax

from runtime.config.run import OuterConfig
from runtime.diloco.sync import averaging
from runtime.diloco.sync import outer_rules
from runtime.diloco.sync.fragment_trees import FragmentTrees
from runtime.checkpoint import snapshot as snapshot_lib
from runtime.diloco.sync.messages import Delivery, Report
from runtime.diloco.sync.shards import Shards
from runtime.errors import ConfigError
from runtime.train import tree_transfer
from runtime.wire.codecs import Codec
from runtime.wire.downlink import NO_MIRROR, Mirrors
from runtime.wire.payload import CorruptPayload

PyTree = Any


@dataclasses.dataclass(frozen=True)
class MergeResult:
  """What one outer step did."""

  version: int  # Θ's version after this step (unchanged when every report was quarantined)
  params: PyTree  # Θ and the outer optimizer's state after the step
  opt_state: PyTree
  merged: tuple[int, ...]  # learners whose reports were merged, and per merged report:
  weights: tuple[float, ...]  # its merge weight,
  staleness: tuple[int, ...]  # how many outer steps behind Θ its base was,
  delta_norms: tuple[float, ...]  # and the norm of its outer gradient
  quarantined: tuple[tuple[int, str], ...]  # (learner, why) of every report kept out of Θ
  update_norm: float  # norm of the outer step applied to Θ
  tokens: int  # tokens and inner steps of the merged reports' rounds
  steps: int
  fragment: int = 0  # the fragment it merged (0 of 1 without fragments)


class Ema:
  """Exponential moving average; 0 until the first update."""

  def __init__(self, decay: float):
    self.decay = decay
    self.value = 0.0
    self._seen = False

  def update(self, x: float) -> float:
    self.value = x if not self._seen else self.decay * self.value + (1 - self.decay) * x
    self._seen = True
    return self.value

  def snapshot(self) -> list:
    return [self.value, self._seen]

  def restore(self, saved: list) -> None:
    self.value, self._seen = saved


def tensor_sums(tree: PyTree) -> jax.Array:
  """Every tensor's fp32 sum of squares, in tree order (a norm is summed from them on the host: Shards.norm)."""
  leaves = jax.tree.leaves(tree)
  return jnp.stack([averaging.sum_of_squares(x) for x in leaves]) if leaves else jnp.zeros(0, jnp.float32)


def outer_delta(ref: PyTree, local: PyTree) -> tuple[PyTree, jax.Array]:
  """One learner's outer gradient Δ_m = Θ_ref − θ_m, and its tensors' sums of squares."""
  delta = jax.tree.map(jnp.subtract, ref, local)
  return delta, tensor_sums(delta)


def merge_sizes(num_learners: int) -> tuple[int, ...]:
  """The numbers of reports the outer step is compiled for: powers of two, capped at M."""
  return tuple(sorted({min(1 << i, num_learners) for i in range(num_learners.bit_length() + 1)}))


def outer_step(theta: PyTree, opt_state: PyTree, deltas: Sequence[PyTree], weights: jax.Array, share: jax.Array, *,
               tx: optax.GradientTransformationExtraArgs, method: str,
               mean_for: Callable[[str], bool] | None) -> tuple[PyTree, PyTree, jax.Array]:
  """Θ' = Θ + tx(merge(Δ, w); share): the outer rule (outer_rules.py) on the merged outer gradient of a merge that is
  `share` of a round; returns Θ', the rule's state and the update's tensors' sums of squares."""
  delta = averaging.merge(deltas, weights, method=method, mean_for=mean_for)
  updates, opt_state = tx.update(delta, opt_state, theta, share=share)
  return optax.apply_updates(theta, updates), opt_state, tensor_sums(updates)


class Syncer:
  """Holds Θ, its history for learners still working from old versions, the outer optimizer, the
  reports waiting to be merged, and the moving averages behind the grace window."""

  def __init__(self, cfg: OuterConfig, params: PyTree, num_learners: int, overlap_steps: int = 0,
               codec: Codec | None = None, mirrors: Mirrors | None = None, fragments: int = 1,
               shards: Shards | None = None):
    self.cfg = cfg
    self.codec = codec  # decodes compressed reports (compression.up != "none")
    self.mirrors = mirrors  # what each learner holds, and Θ's updates to it (compression.down != "none")
    self.num_learners = num_learners  # the most learners there can be (merge sizes are compiled up to it)
    self.tx = outer_rules.outer_transformation(cfg, shards.num if shards else 1)
    self.version = 0
    # Where Θ's tensors live and merge: the host CPU device, or S of them (syncer.shards).
    self.shards = shards or Shards(params, [jax.tree.leaves(params)[0].sharding])
    self.params = params if self.shards.num == 1 else self.shards.place(params)
    self.trees = FragmentTrees(params, fragments)
    # Explicit: momentum buffers depend on no input value, so jit would otherwise put them on the default device.
    inits = [jax.jit(self.tx.init, out_shardings=sharding) for sharding in self.shards.shardings]
    self.opt_state = self._outer_tree([[inits[s](part) if self.shards.holds(part, s) else None
                                        for s, part in enumerate(self.shards.parts(self.trees.part(self.params, p)))]
                                       for p in range(fragments)])
    self._overlap_steps = overlap_steps
    # Θ's history: every version a learner may still name (a report from a version no longer named is
    # quarantined), and its tensors only where something reads them, else None (see commit).
    self._history: dict[int, PyTree | None] = {0: self.params}
    # Its readers: a whole report measured from its base, a compressed one rebuilt from it, a mirror's first update.
    base = cfg.outer_grad_base == "base"
    self._reads_history = (base and codec is None) or (not base and codec is not None) or mirrors is not None
    self._sent: dict[int, int] = {}  # learner -> the Θ version last sent to it (kept while it may be on its way)
    self._mirrored: set[int] = set()  # learners whose last Θ went compressed (they read their mirror, not the history)
    self._unadopted: dict[int, int] = {}  # ... and the version of it each has not adopted yet (resendable whole)
    self._accepted_norm_ema: list[float | None] = [None] * fragments  # per fragment
    self._pending: list[Report] = []
    self._failed_merges = 0  # merges in a row that committed nothing, and their reasons
    self._failed: list[str] = []
    # Moving averages of a learner's step time, the time from a first report to quorum, and a sync.
    self.xi_step, self.xi_quorum, self.xi_sync = (Ema(cfg.ema_decay) for _ in range(3))
    mean_for = averaging.is_embedding if cfg.embed_mean else None
    self._delta = jax.jit(outer_delta)
    self._sums = jax.jit(tensor_sums)
    self._rebuild = jax.jit(lambda base, delta: jax.tree.map(lambda b, d: b - d.astype(b.dtype), base, delta))
    # The deltas (argument 2) are temporaries of this merge.
    self._step = jax.jit(functools.partial(outer_step, tx=self.tx, method=cfg.merge, mean_for=mean_for),
                         donate_argnums=2)
    self._programs: dict[tuple[int, int], Any] = {}  # (fragment, merge size) -> the compiled outer step

  # Reports and the quorum ------------------------------------------------------------------------

  def receive(self, report: Report) -> None:
    """A report has arrived; it waits for the next merge."""
    self._pending.append(report)

  @property
  def pending(self) -> tuple[Report, ...]:
    return tuple(self._pending)

  def quorum(self, able: int) -> int:
    """The quorum K, never more than the `able` learners that can still report."""
    return max(1, min(self.cfg.quorum, able))

  def ready(self, able: Sequence[int]) -> int | None:
    """The fragment whose waiting reports reach its quorum (`able[p]`: learners that can report fragment p next),
    the one waiting longest first; None if none does."""
    for p in self._waiting():
      if sum(r.fragment == p for r in self._pending) >= self.quorum(able[p]):
        return p
    return None

  def _waiting(self) -> list[int]:
    """The fragments with waiting reports, the one whose first report was sent earliest first."""
    first: dict[int, float] = {}
    for r in self._pending:
      first[r.fragment] = min(first.get(r.fragment, r.sent_at), r.sent_at)
    return sorted(first, key=lambda p: (first[p], p))

  def take_pending(self, fragment: int | None = None) -> list[Report]:
    """The reports of the merge that starts now: `fragment`'s (default: the one waiting longest)."""
    fragment = self._waiting()[0] if fragment is None else fragment
    reports = [r for r in self._pending if r.fragment == fragment]
    self._pending = [r for r in self._pending if r.fragment != fragment]
    return reports

  # The grace window -------------------------------------------------------------------------------

  def observe_round(self, seconds_per_step: float) -> None:
    self.xi_step.update(seconds_per_step)

  def observe_quorum(self, now: float, fragment: int = 0) -> None:
    """The fragment's quorum is reached now: time since its first waiting report was sent."""
    self.xi_quorum.update(now - min(r.sent_at for r in self._pending if r.fragment == fragment))

  def observe_sync(self, seconds: float) -> None:
    """One sync's answer took `seconds` once its reports were up: the merge and Θ down (the wait for the quorum,
    from the first report's sending, is ξ_quorum: counting the report's way up in both shortened the window by one
    transfer)."""
    self.xi_sync.update(seconds)

  def grace_seconds(self, now: float, needs_theta_at: Sequence[float]) -> float:
    """Extra wait after quorum: fixed, or the learners' overlap slack not used by quorum and sync.

    Never past the moment a waiting report's learner would finish its overlap and wait for Θ
    (`needs_theta_at`, one time per waiting report).
    """
    if self.cfg.grace == "fixed":
      grace = self.cfg.grace_seconds
    elif self.cfg.grace == "adaptive":
      slack = self._overlap_steps * self.xi_step.value - self.xi_quorum.value - self.xi_sync.value
      grace = self.cfg.grace_gamma * max(slack, 0.0)
    else:
      return 0.0
    deadlines = [t - now - self.xi_sync.value for t in needs_theta_at]
    return max(0.0, min([grace, *deadlines]))

  # The outer step ---------------------------------------------------------------------------------

  def reference(self, report: Report) -> PyTree:
    """The Θ that a report's outer gradient is measured against (its fragment's tensors)."""
    return self.trees.part(self.params if self.cfg.outer_grad_base == "current" else self.base(report),
                           report.fragment)

  def base(self, report: Report) -> PyTree | None:
    """The Θ the report's learner started from: Θ_base whole, or its mirror Θ̃_m; None once it is gone."""
    if report.base_mirror == NO_MIRROR:
      return self._history.get(report.base_version)  # (None too where no reader keeps its tensors)
    return self.mirrors.get(report.learner, report.base_mirror)

  def _knows_base(self, report: Report) -> bool:
    """Whether the Θ a report started from is still named (its tensors are kept only if something reads them)."""
    if report.base_mirror == NO_MIRROR:
      return report.base_version in self._history
    return self.base(report) is not None

  def compute(self, reports: Sequence[Report], members: int | None = None) -> MergeResult:
    """Screens and merges `reports` into a new Θ; pure with respect to the syncer (see commit).

    `members`: the learners present when the merge began (default: all there can be). The reports are all of one
    fragment, whose tensors alone the step moves."""
    p = reports[0].fragment
    theta, outer = self.trees.part(self.params, p), self._outer_states(p)
    opened = [self._outer_gradient(r) for r in reports]
    deltas, norms, whys = zip(*opened)
    norms = np.asarray(jax.device_get(norms), np.float64)
    keep, quarantined = [], []
    for i, (report, norm) in enumerate(zip(reports, norms)):
      reason = whys[i] or self._screen(norm, p)
      if reason:
        quarantined.append((report.learner, reason))
      else:
        keep.append(i)
    rejected = MergeResult(version=self.version, params=self.params, opt_state=self.opt_state, merged=(),
                           weights=(), staleness=(), delta_norms=(), quarantined=tuple(quarantined),
                           update_norm=0.0, tokens=0, steps=0, fragment=p)
    if not keep:
      return rejected
    kept = [reports[i] for i in keep]
    if self.cfg.token_weighting:
      weights = averaging.token_weight(*zip(*(r.trained() for r in kept)))
    else:
      weights = np.ones(len(kept), np.float32)
    # outer.merge_one_by_one (a diagnostic): the reports go through the rule as merges of one each, all measured from
    # the Θ this merge began with.
    groups = [[j] for j in range(len(kept))] if self.cfg.merge_one_by_one else [list(range(len(kept)))]
    parts, sums = [], []
    for s, (theta_s, outer_s) in enumerate(zip(self.shards.parts(theta), outer)):
      if outer_s is None:  # (no tensor of this fragment on shard s)
        parts.append(theta_s)
        sums.append(None)
        continue
      began = theta_s
      for group in groups:
        theta_s, outer_s, sums_s = self._apply(theta_s, outer_s, [deltas[keep[j]][s] for j in group], weights[group],
                                               len(group) / (members or self.num_learners), p, s)
      if len(groups) > 1:  # the norm of the whole update
        sums_s = self._delta(began, theta_s)[1]
      outer[s] = outer_s
      parts.append(theta_s)
      sums.append(sums_s)
    theta = self.shards.join(parts)
    update_norm, delta_norm = float(self.shards.norm(sums, theta)), float(np.mean(norms[keep]))
    reason = self._screen_step(update_norm, delta_norm, p)
    if reason:  # Θ would diverge: nothing is committed, and the reports' data is trained again
      return dataclasses.replace(rejected, quarantined=(*rejected.quarantined, *((r.learner, reason) for r in kept)))
    return MergeResult(
        version=self.version + 1, params=self.trees.put(self.params, theta, p),
        opt_state=self._with_outer_states(p, outer),
        merged=tuple(r.learner for r in kept), fragment=p,
        quarantined=tuple(quarantined), weights=tuple(float(w) for w in weights[:len(kept)]),
        staleness=tuple(self.version - r.base_version for r in kept),
        delta_norms=tuple(float(norms[i]) for i in keep), update_norm=update_norm,
        tokens=sum(r.tokens for r in kept), steps=sum(r.steps for r in kept))

  def _apply(self, theta: PyTree, outer: PyTree, deltas: list[PyTree], weights: np.ndarray, share: float, p: int,
             s: int) -> tuple[PyTree, PyTree, jax.Array]:
    """One outer step of fragment p on shard s: the deltas merged with their weights, through the rule as `share` of
    a round (a merge of n of M learners is n/M of one). Padded with zero deltas of weight 0 up to a compiled size, so
    no merge waits for a compilation."""
    size = next(n for n in merge_sizes(self.num_learners) if n >= len(deltas))
    pads = [self._delta(theta, theta)[0] for _ in range(size - len(deltas))]
    weights = np.concatenate([weights, np.zeros(size - len(deltas), np.float32)])
    # Every operand is placed explicitly where the shard lives (a host CPU), never on the default device.
    return self._program(size, p, s)(theta, outer, deltas + pads,
                                     *jax.device_put((weights, np.float32(share)), self.shards.shardings[s]))

  def _outer_gradient(self, report: Report) -> tuple[PyTree, Any, str]:
    """A report's outer gradient measured from its reference Θ, and its norm; or why it cannot be.

    θ_m sent whole: Θ_ref − θ_m. Compressed: Δ̂_m as sent where it was measured from the Θ the learner started from
    (outer_grad_base "base"), else Θ_current − θ_m with θ_m rebuilt as Θ_base − Δ̂_m (Θ_base read from the history
    or the learner's mirror)."""
    nothing = np.float32(np.nan)
    if not self._knows_base(report):
      return None, nothing, f"its base Θ (version {report.base_version}, mirror {report.base_mirror}) is gone"
    ref = self.reference(report)
    if report.payload is None:
      local = report.params if self.shards.num == 1 else self.shards.place(report.params)
      return (*self._per_shard(self._delta, ref, local), "")
    try:
      delta = self.shards.place(self.codec.open(report.payload))  # dequantized on the host CPU
    except CorruptPayload as error:
      return None, nothing, f"corrupt payload: {error}"
    if self.cfg.outer_grad_base == "base":
      return (*self._per_shard(lambda d: (d, self._sums(d)), delta), "")
    local = self.shards.join([self._rebuild(b, d) if self.shards.holds(b, s) else b for s, (b, d) in
                              enumerate(zip(self.shards.parts(self.base(report)), self.shards.parts(delta)))])
    return (*self._per_shard(self._delta, ref, local), "")

  def _per_shard(self, program: Callable, tree: PyTree, *more: PyTree) -> tuple[list[PyTree | None], np.float32]:
    """`program` (→ a tree and its tensors' sums of squares) on every shard holding tensors of `tree`: the trees
    (None on a shard holding none) and the norm of them all."""
    trees, sums = [], []
    for s, parts in enumerate(zip(*(self.shards.parts(t) for t in (tree, *more)))):
      if not self.shards.holds(parts[0], s):
        trees.append(None)
        sums.append(None)
        continue
      out, sums_s = program(*parts)
      trees.append(out)
      sums.append(sums_s)
    return trees, self.shards.norm(sums, tree)

  def land(self, params: PyTree) -> PyTree:
    """A report's tensors copied where the syncer merges them (each on its shard's host CPU)."""
    if self.shards.num == 1:
      return tree_transfer.copy_to(params, self.shards.shardings[0])  # (a staged report: read where it was staged)
    # Copied on each shard: device_put onto a device the learner's slice also uses may share its buffer, which the
    # learner's next round donates (tree_transfer.copy_to).
    return jax.tree.map(jnp.copy, self.shards.place(tree_transfer.host_view(params)))

  def compile_merges(self) -> None:
    """Compiles the outer step for every fragment and merge size ahead of the first merge (off the critical path)."""
    for p in range(self.trees.num):
      for s, theta in enumerate(self.shards.parts(self.trees.part(self.params, p))):
        if self.shards.holds(theta, s):
          self._delta(theta, theta)  # the per-report program too
          for size in merge_sizes(self.num_learners):
            self._program(size, p, s)

  def _outer_tree(self, states: list[list[PyTree | None]]) -> PyTree:
    """The outer state as kept (and checkpointed) from states[p][s] (fragment p, shard s): one tree with one fragment
    and one shard, else a tuple per fragment of a tuple per shard (each level only where there are several)."""
    per_fragment = [tuple(row) if self.shards.num > 1 else row[0] for row in states]
    return tuple(per_fragment) if self.trees.num > 1 else per_fragment[0]

  def _outer_states(self, p: int) -> list[PyTree | None]:
    """Fragment p's outer-optimizer state on each shard (None where the shard holds none of its tensors)."""
    state = self.opt_state if self.trees.num == 1 else self.opt_state[p]
    return list(state) if self.shards.num > 1 else [state]

  def _with_outer_states(self, p: int, states: list[PyTree | None]) -> PyTree:
    """The outer state with fragment p's replaced by `states` (one per shard)."""
    rows = [self._outer_states(q) for q in range(self.trees.num)]
    rows[p] = states
    return self._outer_tree(rows)

  def _program(self, size: int, p: int, s: int) -> Any:
    """The outer step compiled for `size` reports of fragment p on shard s (ahead of time, once per size, fragment
    and shard)."""
    if (p, size, s) not in self._programs:
      like = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
      sharding = self.shards.shardings[s]
      scalar = lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)
      with warnings.catch_warnings():  # Θ and the momentum can reuse two of the donated deltas, not all
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        theta = self.shards.part(self.trees.part(self.params, p), s)
        self._programs[p, size, s] = self._step.lower(like(theta), like(self._outer_states(p)[s]),
                                                      [like(theta)] * size, scalar((size,)), scalar(())).compile()
    return self._programs[p, size, s]

  def commit(self, result: MergeResult, live: Sequence[tuple[int, int]]) -> None:
    """Adopts a computed merge; keeps only the Θ versions some learner may still name: `live` (the (mirror,
    version) each learner works from), those last sent, and the current one.

    A version's tensors are kept only where something reads them: a report's base whole (a whole report measured
    from it, a compressed one rebuilt from it for the current Θ, the first compressed Θ down to a learner holding it
    whole) and a compressed Θ not adopted yet (sent again whole if it cannot be). A learner holding a mirror reads
    it, not the history; whole reports measured from the current Θ and compressed ones from their base read none."""
    self._failed = [] if result.merged else [*self._failed, *(why for _, why in result.quarantined)][-64:]
    self._failed_merges = 0 if result.merged else self._failed_merges + 1
    if result.merged:
      self.params, self.opt_state, self.version = result.params, result.opt_state, result.version
      mean_norm, ema = float(np.mean(result.delta_norms)), self._accepted_norm_ema[result.fragment]
      self._accepted_norm_ema[result.fragment] = mean_norm if not ema else 0.9 * ema + 0.1 * mean_norm
    self._history[self.version] = self.params
    named = {v for _, v in live} | set(self._sent.values()) | {self.version}
    read = {self.version}
    if self._reads_history:
      whole_sent = {v for m, v in self._sent.items() if m not in self._mirrored}
      read |= {v for mirror, v in live if mirror == NO_MIRROR} | whole_sent | set(self._unadopted.values())
    self._history = {v: p if v in read else None for v, p in self._history.items() if v in named}

  def adopted(self, learner: int) -> None:
    """The learner adopted the Θ last sent to it: a compressed one will not be sent again whole."""
    self._unadopted.pop(learner, None)

  def answer(self, report: Report, verdict: str) -> Delivery:
    """The current Θ for the learner of a report that was "merged", "quarantined" (the learner starts
    afresh from Θ and trains that report's data again) or "lost" on its link (it trains it again)."""
    rewind_to = None if verdict == "merged" else report.data_start
    self._sent[report.learner] = self.version  # its next report may be measured from it, adopted after a slow trip
    self._mirrored.discard(report.learner)  # (until it goes compressed, below)
    self._unadopted.pop(report.learner, None)
    if self.trees.num > 1 and verdict == "merged":  # only the fragment's new tensors go down
      return Delivery(self.version, self.trees.part(self.params, report.fragment), report.round,
                      fragment=report.fragment)
    base = self.base(report) if self.mirrors and verdict != "quarantined" else None  # a reset gets Θ whole
    if base is None:
      return Delivery(self.version, self.params, report.round, reset=verdict == "quarantined", rewind_to=rewind_to)
    self._mirrored.add(report.learner)
    self._unadopted[report.learner] = self.version
    payload, mirror = self.mirrors.send(report.learner, self.params, base)
    return Delivery(self.version, None, report.round, rewind_to=rewind_to, payload=payload,
                    base=(report.base_mirror, report.base_version), mirror=mirror)

  def resend(self, delivery: Delivery) -> Delivery:
    """The Θ of a compressed delivery that could not be adopted (damaged, or for another Θ), whole."""
    return dataclasses.replace(delivery, params=self._history[delivery.version], payload=None)

  def divergence(self) -> str:
    """Why training has diverged (outer.divergence_merges merges in a row committed nothing), or ''."""
    n = self.cfg.divergence_merges
    if self._failed_merges < n:
      return ""
    if any(why.startswith("outer step") for why in self._failed):
      likely = (f"outer.lr (now {self.cfg.lr:g}) or outer.momentum (now {self.cfg.momentum:g}): the outer "
                "step itself blew up")
    elif any(why == "non-finite" for why in self._failed):
      likely = "inner.lr or inner.grad_clip: the learners' own training produced NaN/Inf"
    else:
      likely = ("inner.lr, or outer.quarantine_factor / outer.max_delta_norm if such deltas are expected: "
                "every report was far larger than the accepted ones")
    return (f"training diverged: {n} merges in a row committed nothing to Θ (last reason: {self._failed[-1]}). "
            f"Likely cause: {likely}. Θ was left at version {self.version}.")

  def _screen_step(self, update_norm: float, delta_norm: float, p: int) -> str:
    """Why an outer step of fragment p of this norm must not be committed, or '' if it may."""
    limit = self.cfg.max_update_ratio * max(delta_norm, self._accepted_norm_ema[p] or 0.0)
    if not np.isfinite(update_norm) or update_norm > limit:
      return (f"outer step rejected: its norm {update_norm:.3g} > outer.max_update_ratio "
              f"{self.cfg.max_update_ratio:g} × the merged deltas' norm {delta_norm:.3g}")
    return ""

  def latest(self, round_: int) -> Delivery:
    """The current Θ for a learner in `round_` that asks for it (a finished learner given budget again)."""
    return Delivery(self.version, self.params, round_)

  def snapshot(self, packer: snapshot_lib.Packer) -> dict:
    """Θ, its version and history, the outer optimizer, the waiting reports, the screens' and grace window's state."""
    return dict(version=self.version, shards=self.shards.num, params=packer.tree(self.params, "params"),
                opt_state=packer.tree(self.opt_state, "outer"),
                history=[[v, packer.tree(p, "params")] for v, p in self._history.items()],
                accepted_norm_ema=self._accepted_norm_ema[0] if self.trees.num == 1 else self._accepted_norm_ema,
                pending=[packer.value(r) for r in self._pending],
                failed_merges=self._failed_merges, failed=list(self._failed), sent=sorted(self._sent.items()),
                mirrored=sorted(self._mirrored), unadopted=sorted(self._unadopted.items()),
                emas=[e.snapshot() for e in (self.xi_step, self.xi_quorum, self.xi_sync)],
                mirrors=self.mirrors.snapshot(packer) if self.mirrors else None)

  def restore(self, saved: dict, unpacker: snapshot_lib.Unpacker) -> None:
    """The syncer as `snapshot` saw it, each tensor where this syncer keeps it; refused (one line) if it was saved
    in another number of shards (their outer-optimizer states are one per shard)."""
    if saved.get("shards", 1) != self.shards.num:
      raise ConfigError("syncer.shards", self.shards.num, f"{saved.get('shards', 1)}, as the checkpoint was saved "
                        "with (resume with the same number of syncer shards)")
    self.version = saved["version"]
    place, where = (self.shards.placer(), "shards") if self.shards.num > 1 else (None, snapshot_lib.HOST)
    self.params = unpacker.tree(saved["params"], place, where)
    self._history = {v: unpacker.tree(p, place, where) for v, p in saved["history"]}
    self.opt_state = unpacker.tree(saved["opt_state"])
    if self.shards.num > 1:  # each shard's state (a tuple per shard, per fragment with several) onto its device
      self.opt_state = self._outer_tree([[None if state is None else jax.device_put(state, self.shards.shardings[s])
                                          for s, state in enumerate(self._outer_states(p))]
                                         for p in range(self.trees.num)])
    ema = saved["accepted_norm_ema"]
    self._accepted_norm_ema = list(ema) if isinstance(ema, list) else [ema]
    self._pending = [unpacker.value(r) for r in saved["pending"]]
    self._failed_merges, self._failed = saved["failed_merges"], list(saved["failed"])
    self._sent = dict(saved.get("sent", []))  # (checkpoints from before it was kept)
    # (checkpoints from before the history kept only what is read: every sent Θ counts as whole, kept as then)
    self._mirrored, self._unadopted = set(saved.get("mirrored", [])), dict(saved.get("unadopted", []))
    for ema, state in zip((self.xi_step, self.xi_quorum, self.xi_sync), saved["emas"]):
      ema.restore(state)
    if self.mirrors:
      self.mirrors.restore(saved.get("mirrors"), unpacker)

  def _screen(self, norm: float, p: int) -> str:
    """Why a delta of fragment p of this norm must not be merged, or '' if it may."""
    if not np.isfinite(norm):
      return "non-finite"
    if norm > self.cfg.max_delta_norm:
      return f"norm {norm:.3g} > max_delta_norm {self.cfg.max_delta_norm:.3g}"
    ema = self._accepted_norm_ema[p]
    if ema and norm > self.cfg.quarantine_factor * ema:  # relative only once a typical norm is known
      return f"norm {norm:.3g} > {self.cfg.quarantine_factor:g} × recent norm {ema:.3g}"
    return ""

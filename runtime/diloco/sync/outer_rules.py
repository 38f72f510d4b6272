"""The outer step as one optax transformation: how a merge's merged outer gradient moves Θ.

`outer_transformation(cfg)` is a chain: the merge's share of a round scales the merged outer gradient (outer.scale
"fraction"), then the rule turns it into Θ's update. Its `update(delta, state, theta, share=σ)` takes σ, the
merge's share of a synchronous round (n of M learners: n/M), and its state is everything the rule keeps between
merges (its momentum, what it has buffered, how much of a round it has seen); the syncer checkpoints it whole.

A rule is one transformation, written once, and declares whether it is elementwise: the sharded syncer
(syncer.shards > 1) runs it on each shard's tensors alone, which is the same step only when the step of each tensor
depends on that tensor and on σ alone. A rule that is not is refused there in one line (`outer_transformation`).

Rejecting a step (its norm against the merged deltas', outer.max_update_ratio) stays with the syncer: it needs the
norm over every shard's tensors, which no shard's transformation sees; a rejected step's state is not adopted.
"""

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from runtime.config.run import OuterConfig
from runtime.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Rule:
  """An outer rule: its transformation on the share-scaled outer gradient (learning rate included), and whether
  that transformation is elementwise."""

  build: Callable[[OuterConfig], optax.GradientTransformationExtraArgs]
  elementwise: bool


def _nesterov(cfg: OuterConfig) -> optax.GradientTransformationExtraArgs:
  """SGD with (Nesterov) momentum: one momentum step per merge, whatever its share."""
  return optax.sgd(cfg.lr, momentum=cfg.momentum or None, nesterov=cfg.nesterov and cfg.momentum > 0)


def _momentum_per_round(cfg: OuterConfig) -> optax.GradientTransformationExtraArgs:
  """SGD with (Nesterov) momentum decaying by momentum^σ at a merge of share σ, so by `momentum` per round's worth
  of merges, as one synchronous round does whatever the quorum; merges of a whole round each are nesterov's."""
  if not cfg.momentum:
    return _nesterov(cfg)
  return optax.chain(trace_per_share(cfg.momentum, cfg.nesterov), optax.scale_by_learning_rate(cfg.lr))


def trace_per_share(decay: float, nesterov: bool = True) -> optax.GradientTransformationExtraArgs:
  """optax.trace whose decay at a merge of share σ is decay^σ."""

  def init(params):
    return optax.TraceState(trace=jax.tree.map(jnp.zeros_like, params))

  def update(updates, state, params=None, *, share, **extra):
    del params, extra
    decayed = jnp.asarray(decay, jnp.float32) ** share
    trace = jax.tree.map(lambda g, t: g + decayed * t, updates, state.trace)
    out = jax.tree.map(lambda g, t: g + decayed * t, updates, trace) if nesterov else trace
    return out, optax.TraceState(trace=trace)

  return optax.GradientTransformationExtraArgs(init, update)


class DelayedNesterovState(NamedTuple):
  """Delayed Nesterov's state: the momentum, and the round it has not stepped for yet."""

  momentum: optax.Updates  # m: one step per round's worth of merges
  buffer: optax.Updates  # the (share-scaled) outer gradients merged in this round so far
  filled: jax.Array  # the shares of a round they make up, in [0, 1)


ROUND_EPS = 1e-6  # shares within this of a round's end end it (float32 sums of n/M miss 1 by rounding)


def _delayed_nesterov(cfg: OuterConfig) -> optax.GradientTransformationExtraArgs:
  """Delayed Nesterov (`delayed_nesterov`) at the learning rate; without momentum it is plain SGD, as every rule."""
  if not cfg.momentum:
    return _nesterov(cfg)
  return optax.chain(delayed_nesterov(cfg.momentum, cfg.nesterov), optax.scale_by_learning_rate(cfg.lr))


def delayed_nesterov(decay: float, nesterov: bool = True) -> optax.GradientTransformationExtraArgs:
  """Delayed Nesterov (Liu et al. 2024, arXiv 2401.09135, its momentum activation c = 0): a merge of outer
  gradient u and share σ applies a plain step of u and adds it to the round's buffer b; the merge that fills a
  round's worth of shares also steps the momentum once, m ← μ·m + b, and its update is u + μ·m (Nesterov; heavy ball:
  with the old m). A merge crossing the round's end adds only the part of u inside the round, (1 − f)/σ of it where
  f was filled before; the rest opens the next round's buffer. Merges of a whole round each take outer.rule=nesterov's
  steps (equal up to float rounding: XLA may contract the two programs' multiply-adds differently on large tensors).
  """

  def init(params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return DelayedNesterovState(zeros(), zeros(), jnp.zeros((), jnp.float32))

  def update(updates, state, params=None, *, share, **extra):
    del params, extra
    filled = state.filled + share
    past = jnp.where(filled - 1 > ROUND_EPS, filled - 1, 0.0)  # the part of σ past the round's end
    ends = filled > 1 - ROUND_EPS
    inside = jnp.where(share > 0, (share - past) / share, 1.0)  # the part of u in this round (1 unless it crosses)
    buffer = jax.tree.map(lambda b, u: b + (inside * u).astype(u.dtype), state.buffer, updates)
    stepped = jax.tree.map(lambda b, m: b + decay * m, buffer, state.momentum)
    looked = jax.tree.map(lambda u, m: u + decay * m, updates, stepped if nesterov else state.momentum)
    pick = lambda a, b: jax.tree.map(lambda x, y: jnp.where(ends, x, y), a, b)
    rest = jax.tree.map(lambda u: ((1 - inside) * u).astype(u.dtype), updates)
    new = DelayedNesterovState(momentum=pick(stepped, state.momentum), buffer=pick(rest, buffer),
                               filled=jnp.where(ends, past, filled))
    return pick(looked, updates), new

  return optax.GradientTransformationExtraArgs(init, update)


RULES: dict[str, Rule] = {  # (the names of OUTER_RULES, runtime/config/run.py)
    "nesterov": Rule(_nesterov, elementwise=True),
    "delayed_nesterov": Rule(_delayed_nesterov, elementwise=True),
    "momentum_per_round": Rule(_momentum_per_round, elementwise=True),
}


def scale_by_share() -> optax.GradientTransformationExtraArgs:
  """The merged outer gradient × σ: a merge of n of M learners is n/M of a synchronous outer step."""

  def update(updates, state, params=None, *, share, **extra):
    del params, extra
    return jax.tree.map(lambda d: d * share, updates), state

  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)


def outer_transformation(cfg: OuterConfig, shards: int = 1) -> optax.GradientTransformationExtraArgs:
  """The outer step of `cfg`'s rule; refused (one line) on a sharded syncer if the rule is not elementwise."""
  rule = RULES[cfg.rule]
  if shards > 1 and not rule.elementwise:
    fit = sorted(n for n, r in RULES.items() if r.elementwise)
    raise ConfigError("outer.rule", cfg.rule, f"one of {fit} with syncer.shards={shards} (its step is not elementwise, "
                      "so each shard's part of it would differ), or syncer.shards=1")
  scale = scale_by_share() if cfg.scale == "fraction" else optax.identity()
  return optax.chain(scale, rule.build(cfg))

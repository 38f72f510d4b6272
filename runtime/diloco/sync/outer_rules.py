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
from typing import Callable

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
  of merges, as one synchronous round does whatever the quorum."""
  if not cfg.momentum:
    return _nesterov(cfg)
  inner = optax.inject_hyperparams(optax.sgd, static_args=("nesterov",))(cfg.lr, momentum=cfg.momentum,
                                                                        nesterov=cfg.nesterov)

  def update(updates, state, params=None, *, share, **extra):
    del extra
    decay = jnp.asarray(cfg.momentum, jnp.float32) ** share
    return inner.update(updates, state._replace(hyperparams={**state.hyperparams, "momentum": decay}), params)

  return optax.GradientTransformationExtraArgs(inner.init, update)


RULES: dict[str, Rule] = {
    "nesterov": Rule(_nesterov, elementwise=True),
    "momentum_per_round": Rule(_momentum_per_round, elementwise=True),
}


def scale_by_share() -> optax.GradientTransformationExtraArgs:
  """The merged outer gradient × σ: a merge of n of M learners is n/M of a synchronous outer step."""

  def update(updates, state, params=None, *, share, **extra):
    del params, extra
    return jax.tree.map(lambda d: d * share, updates), state

  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)


def rule_name(cfg: OuterConfig) -> str:
  return "momentum_per_round" if cfg.momentum_per == "round" and cfg.momentum > 0 else "nesterov"


def outer_transformation(cfg: OuterConfig, shards: int = 1) -> optax.GradientTransformationExtraArgs:
  """The outer step of `cfg`'s rule; refused (one line) on a sharded syncer if the rule is not elementwise."""
  name = rule_name(cfg)
  rule = RULES[name]
  if shards > 1 and not rule.elementwise:
    fit = sorted(n for n, r in RULES.items() if r.elementwise)
    raise ConfigError("outer.rule", name, f"one of {fit} with syncer.shards={shards} (its step is not elementwise, "
                      "so each shard's part of it would differ), or syncer.shards=1")
  scale = scale_by_share() if cfg.scale == "fraction" else optax.identity()
  return optax.chain(scale, rule.build(cfg))

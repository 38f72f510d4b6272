"""The syncer on its own: the outer step, screening, weighting, the quorum and the grace window."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from runtime.cluster import devices as devices_lib
from runtime.config.run import OUTER_RULES, OuterConfig
from runtime.diloco.sync import outer_rules
from runtime.diloco.sync.messages import Report
from runtime.diloco.sync.syncer import Syncer, merge_sizes, outer_step
from runtime.errors import ConfigError


def _report(learner, params, tokens=100, steps=10, base=0):
  return Report(learner, params, tokens, steps, base, loss=1.0, sent_at=0.0)


def _syncer(**outer):
  cfg = dataclasses.replace(OuterConfig(lr=1.0, momentum=0.0, nesterov=False, merge="mean"), **outer)
  return Syncer(cfg, {"w": jnp.zeros(3)}, num_learners=4)


def test_a_merge_of_one_of_four_learners_is_a_quarter_outer_step():
  theta_local = {"w": jnp.array([4.0, 0.0, -8.0])}
  full = _syncer(scale="none").compute([_report(0, theta_local)])
  quarter = _syncer(scale="fraction").compute([_report(0, theta_local)])
  np.testing.assert_allclose(full.params["w"], [4.0, 0.0, -8.0])
  np.testing.assert_allclose(quarter.params["w"], [1.0, 0.0, -2.0])


def _momentum_after(syncer, merges):
  """The outer momentum after committing `merges` (each a list of learners reporting θ = Θ − 1)."""
  for learners in merges:
    result = syncer.compute([_report(m, jax.tree.map(lambda x: x - 1.0, syncer.params), base=syncer.version)
                             for m in learners])
    assert result.merged == tuple(learners)
    syncer.commit(result, live=[(-1, result.version)])
  return np.asarray(jax.tree.leaves(syncer.opt_state)[-1])


def test_per_round_momentum_decays_by_mu_per_m_reports_and_equals_per_merge_momentum_for_full_merges():
  outer = dict(momentum=0.6, nesterov=True, scale="none")
  full = [[0, 1, 2, 3]] * 3
  per_merge, per_round = (_momentum_after(_syncer(rule=r, **outer), full) for r in ("nesterov", "momentum_per_round"))
  np.testing.assert_array_equal(per_merge, per_round)  # n = M: the same step, bit for bit
  ones = [[0], [1], [2], [3]]  # four merges of one learner: the momentum of one synchronous round's decay
  trace = _momentum_after(_syncer(rule="momentum_per_round", **outer), ones)
  decay = np.float32(0.6) ** 0.25
  expected = sum(decay**k for k in range(4))  # each merge adds a unit outer gradient to the decayed trace
  np.testing.assert_allclose(trace, np.full(3, expected), rtol=1e-6)
  assert not np.allclose(_momentum_after(_syncer(**outer), ones), expected)  # per merge: 1 + 0.6 + 0.36 + 0.216


def _merge_sequence(syncer, sequence):
  """Commits one merge per (learners, c): each learner reports θ = Θ − c, so the merged outer gradient is c."""
  for learners, c in sequence:
    result = syncer.compute([_report(m, jax.tree.map(lambda x: x - c, syncer.params), base=syncer.version)
                             for m in learners])
    syncer.commit(result, live=[(-1, result.version)])
  return np.asarray(syncer.params["w"])


# Shares ¼, ½, ¼ (a round), 1 (a round), ¾, then ½ crossing the round's end (¼ in, ¼ into the next), then ¾.
_SHARES_SEQUENCE = [([0], 1.0), ([1, 2], -2.0), ([3], 4.0), ([0, 1, 2, 3], 0.5), ([0, 1, 2], 3.0), ([3, 0], -1.0),
                    ([1, 2, 3], 2.0)]


def _delayed_nesterov_by_hand(lr, mu, nesterov):
  """Θ's path under delayed Nesterov, one scalar, in float64: every merge a plain step of its share-scaled outer
  gradient u = σ·c; the merge that fills a round also steps the momentum by the round's buffer (only the part of a
  crossing u inside the round) and adds μ·m (Nesterov: the new m; heavy ball: the old one)."""
  theta, m, buffer, filled = 0.0, 0.0, 0.0, 0.0
  for learners, c in _SHARES_SEQUENCE:
    share = len(learners) / 4
    u = share * c
    if filled + share < 1 - 1e-9:
      buffer, filled = buffer + u, filled + share
      theta -= lr * u
      continue
    past = filled + share - 1
    inside = (share - past) / share
    old = m
    m = mu * m + buffer + inside * u
    theta -= lr * (u + mu * (m if nesterov else old))
    buffer, filled = (1 - inside) * u, past
  return theta


@pytest.mark.parametrize("nesterov", [True, False])
def test_delayed_nesterov_follows_the_hand_computation_over_partial_and_crossing_merges(nesterov):
  syncer = _syncer(rule="delayed_nesterov", lr=0.7, momentum=0.6, nesterov=nesterov, scale="fraction")
  theta = _merge_sequence(syncer, _SHARES_SEQUENCE)
  np.testing.assert_allclose(theta, np.full(3, _delayed_nesterov_by_hand(0.7, 0.6, nesterov)), rtol=1e-6)
  state = syncer.opt_state[1][0]
  assert float(state.filled) == pytest.approx(0.0, abs=1e-6)  # ¼ carried + ¾: the fourth round ended exactly


def test_delayed_nesterov_with_a_whole_round_per_merge_is_nesterov():
  full = [([0, 1, 2, 3], c) for c in (1.0, -0.5, 2.0, 0.25)]
  outer = dict(lr=0.7, momentum=0.6, nesterov=True, scale="fraction")
  delayed, nesterov = (_merge_sequence(_syncer(rule=rule, **outer), full) for rule in ("delayed_nesterov", "nesterov"))
  np.testing.assert_allclose(delayed, nesterov, rtol=1e-6)  # (float rounding apart: see delayed_nesterov)
  partial = [([m], c) for m, c in zip(range(4), (1.0, -0.5, 2.0, 0.25))]
  delayed, nesterov = (_merge_sequence(_syncer(rule=rule, **outer), partial)
                       for rule in ("delayed_nesterov", "nesterov"))
  assert not np.allclose(delayed, nesterov)



def test_every_configurable_rule_is_built_and_a_rule_that_is_not_elementwise_is_refused_on_a_sharded_syncer(
    monkeypatch):
  assert tuple(outer_rules.RULES) == OUTER_RULES
  for rule in OUTER_RULES:
    outer_rules.outer_transformation(OuterConfig(rule=rule), shards=4)
  clip = outer_rules.Rule(lambda cfg: optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(cfg.lr)),
                          elementwise=False)
  monkeypatch.setitem(outer_rules.RULES, "clipped", clip)
  outer_rules.outer_transformation(OuterConfig(rule="clipped"), shards=1)
  with pytest.raises(ConfigError, match="outer.rule.*syncer.shards=4") as err:
    outer_rules.outer_transformation(OuterConfig(rule="clipped"), shards=4)
  assert "\n" not in str(err.value)


def _one_round_per_merge(syncer, rounds):
  """Commits one merge of all four learners per round; learner m reports θ = Θ − c·(m + 1)."""
  for c in rounds:
    result = syncer.compute([_report(m, jax.tree.map(lambda x: x - c * (m + 1), syncer.params), base=syncer.version)
                             for m in range(4)])
    syncer.commit(result, live=[(-1, result.version)])
  return np.asarray(syncer.params["w"])


def test_merged_one_by_one_delayed_nesterov_is_the_merged_step_and_nesterov_is_not():
  outer, rounds = dict(lr=0.7, momentum=0.6, nesterov=True, scale="fraction"), (1.0, -0.5, 2.0)
  together = _one_round_per_merge(_syncer(**outer), rounds)
  by_rule = {rule: _one_round_per_merge(_syncer(rule=rule, merge_one_by_one=True, **outer), rounds)
             for rule in OUTER_RULES}
  np.testing.assert_allclose(by_rule["delayed_nesterov"], together, rtol=1e-6)
  assert not np.allclose(by_rule["nesterov"], together, rtol=1e-3)
  assert not np.allclose(by_rule["momentum_per_round"], together, rtol=1e-3)
  plain = dict(outer, momentum=0.0)  # without momentum, one by one is the mean of the outer gradients
  np.testing.assert_allclose(_one_round_per_merge(_syncer(merge_one_by_one=True, **plain), rounds),
                             _one_round_per_merge(_syncer(**plain), rounds), rtol=1e-6)

def test_token_weights_favour_learners_with_more_tokens_per_step():
  syncer = _syncer(scale="none", token_weighting=True)
  result = syncer.compute([_report(0, {"w": jnp.full(3, 1.0)}, tokens=100, steps=10),
                           _report(1, {"w": jnp.full(3, 4.0)}, tokens=200, steps=10)])
  assert result.weights == (1000.0, 4000.0)
  np.testing.assert_allclose(result.params["w"], np.full(3, (1 * 1000 + 4 * 4000) / 5000), rtol=1e-6)


def test_non_finite_and_absurd_reports_are_quarantined_and_the_rest_merged():
  syncer = _syncer(scale="none")
  result = syncer.compute([_report(0, {"w": jnp.array([jnp.nan, 0.0, 0.0])}),
                           _report(1, {"w": jnp.full(3, 1e9)}),
                           _report(2, {"w": jnp.full(3, 2.0)})])
  assert dict(result.quarantined).keys() == {0, 1}
  assert result.merged == (2,)
  np.testing.assert_allclose(result.params["w"], np.full(3, 2.0))


def test_a_delta_far_above_the_recent_norm_is_quarantined_below_the_absolute_limit():
  syncer = _syncer(scale="none")
  syncer.commit(syncer.compute([_report(0, {"w": jnp.full(3, 1.0)})]), [(-1, 0)])  # Θ = 1, recent norm sqrt(3)
  assert syncer.compute([_report(1, {"w": jnp.full(3, 51.0)})]).merged == (1,)  # 50 × recent: kept
  result = syncer.compute([_report(1, {"w": jnp.full(3, 201.0)})])  # 200 × recent, far below 1e6
  assert result.merged == ()
  (learner, reason), = result.quarantined
  assert learner == 1 and "recent norm" in reason


def test_quorum_is_reached_at_exactly_k_reports_and_never_exceeds_the_learners_able():
  syncer = _syncer(quorum=2)
  params = {"w": jnp.ones(3)}
  assert syncer.ready(able=[4]) is None
  syncer.receive(_report(0, params))
  assert syncer.ready(able=[4]) is None
  assert syncer.ready(able=[1]) == 0 and syncer.quorum(1) == 1  # only one learner can still report
  syncer.receive(_report(1, params))
  assert syncer.ready(able=[4]) == 0 and syncer.quorum(4) == 2
  assert [r.learner for r in syncer.take_pending()] == [0, 1] and not syncer.pending
  assert syncer.quorum(0) == 1


def test_adaptive_grace_is_the_overlap_slack_capped_by_the_first_learner_that_needs_theta():
  cfg = OuterConfig(grace="adaptive", grace_gamma=1.0)
  syncer = Syncer(cfg, {"w": jnp.zeros(3)}, num_learners=4, overlap_steps=3)
  syncer.observe_round(2.0)  # 3 overlap steps of 2 s hide 6 s
  syncer.receive(Report(0, {"w": jnp.ones(3)}, 10, 1, 0, loss=1.0, sent_at=10.0))
  syncer.observe_quorum(11.0)  # 1 s from the first report to quorum
  syncer.observe_sync(2.0)
  assert syncer.grace_seconds(11.0, needs_theta_at=[100.0]) == pytest.approx(3.0)  # 6 - 1 - 2
  assert syncer.grace_seconds(11.0, needs_theta_at=[14.5]) == pytest.approx(1.5)  # 14.5 - 11 - 2
  assert syncer.grace_seconds(11.0, needs_theta_at=[12.0]) == 0.0
  fixed = Syncer(dataclasses.replace(cfg, grace="fixed", grace_seconds=4.0), {"w": jnp.zeros(3)}, 4)
  assert fixed.grace_seconds(0.0, needs_theta_at=[100.0]) == 4.0
  assert _syncer(grace="none").grace_seconds(0.0, needs_theta_at=[100.0]) == 0.0


def test_outer_step_with_unit_sgd_moves_theta_by_the_scaled_merged_outer_gradient():
  tx = optax.chain(outer_rules.scale_by_share(), optax.sgd(1.0))
  theta = {"w": jnp.array([1.0, 2.0])}
  deltas = [{"w": jnp.array([0.5, 0.0])}, {"w": jnp.array([1.5, 2.0])}]
  new, _, sums = outer_step(theta, tx.init(theta), deltas, jnp.array([1.0, 3.0]), jnp.float32(0.5), tx=tx,
                            method="mean", mean_for=None)
  norm = np.sqrt(np.sum(sums))
  # Weighted mean of the deltas: (1.25, 1.5); half of it is the step.
  np.testing.assert_allclose(new["w"], [1.0 - 0.625, 2.0 - 0.75])
  assert float(norm) == pytest.approx(np.hypot(0.625, 0.75))


def test_the_syncer_computes_on_the_host_device_whatever_the_default_device():
  # Regression: token weights and the weight/scale arrays were made on the default device (on an
  # accelerator, learner 0's first device), so a merge could queue behind learner 0's round.
  host = devices_lib.host_device()
  others = [d for d in jax.devices() if d != host]  # simulated CPU devices here; the accelerator on a GPU host
  assert others, "needs a default device other than the host's"
  on_host = lambda tree: jax.device_put(tree, host)
  cfg = OuterConfig(lr=1.0, momentum=0.9, nesterov=True, merge="rda", token_weighting=True)
  with jax.default_device(others[0]):
    syncer = Syncer(cfg, on_host({"w": np.zeros(3, np.float32), "embed": np.ones(2, np.float32)}), num_learners=4)
    reports = [_report(0, on_host({"w": np.full(3, 1.0, np.float32), "embed": np.zeros(2, np.float32)}), 100, 10),
               _report(1, on_host({"w": np.full(3, 2.0, np.float32), "embed": np.ones(2, np.float32)}), 300, 20)]
    with jax.transfer_guard("disallow"):  # any implicit transfer (an array made from host data) fails
      result = syncer.compute(reports)
  assert result.weights == (1000.0, 4500.0)
  for leaf in jax.tree.leaves((result.params, result.opt_state)):
    assert leaf.devices() == {host}, leaf.devices()


def test_an_absurd_outer_step_is_never_committed_and_persistent_failure_names_the_likely_field():
  # Regression: outer.lr=1e9 committed a NaN Θ at the first merge; every report was then quarantined and
  # served again forever.
  syncer = _syncer(lr=1e9, scale="none", divergence_merges=3)
  for attempt in range(3):
    assert not syncer.divergence()
    result = syncer.compute([_report(0, {"w": jnp.full(3, 1.0)})])
    (learner, reason), = result.quarantined
    assert result.merged == () and learner == 0 and "outer step" in reason
    syncer.commit(result, [(-1, 0)])
    np.testing.assert_array_equal(syncer.params["w"], np.zeros(3))
    assert syncer.version == 0
  assert "outer.lr" in syncer.divergence() and "3 merges in a row" in syncer.divergence()


def test_a_committed_merge_resets_the_count_of_failed_merges():
  syncer = _syncer(scale="none", divergence_merges=2)
  syncer.commit(syncer.compute([_report(0, {"w": jnp.array([jnp.nan, 0.0, 0.0])})]), [(-1, 0)])
  syncer.commit(syncer.compute([_report(1, {"w": jnp.full(3, 1.0)})]), [(-1, 0)])
  syncer.commit(syncer.compute([_report(0, {"w": jnp.array([jnp.inf, 0.0, 0.0])})]), [(-1, 0)])
  assert not syncer.divergence()
  syncer.commit(syncer.compute([_report(0, {"w": jnp.array([jnp.inf, 0.0, 0.0])})]), [(-1, 0)])
  assert "inner.lr" in syncer.divergence()


def test_after_compile_merges_no_merge_size_compiles_on_the_critical_path():
  # Regression: the outer step was compiled anew for every new number of merged reports, inside the merge.
  assert merge_sizes(8) == (1, 2, 4, 8) and merge_sizes(3) == (1, 2, 3) and merge_sizes(1) == (1,)
  host = devices_lib.host_device()
  cfg = OuterConfig(merge="rda", momentum=0.9, nesterov=True)
  syncer = Syncer(cfg, jax.device_put({"w": np.zeros(3, np.float32)}, host), num_learners=4)
  syncer.compile_merges()
  reports = {n: [_report(m, jax.device_put({"w": np.full(3, m + 1.0, np.float32)}, host)) for m in range(n)]
             for n in (1, 2, 3, 4)}
  compiles = []
  listener = lambda event, *_, **__: compiles.append(event) if "backend_compile" in event else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    for n in (1, 3, 2, 4):
      result = syncer.compute(reports[n])
      syncer.commit(result, [(-1, syncer.version)])
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert not compiles, compiles


def test_the_quorum_wait_behind_the_adaptive_grace_runs_from_the_fragments_first_waiting_report():
  """With K = 2 the wait runs from the first report, not the last; another fragment's earlier report is not its."""
  cfg = OuterConfig(quorum=2, grace="adaptive", grace_gamma=1.0)
  syncer = Syncer(cfg, {"a": jnp.zeros(4), "b": jnp.zeros(3)}, num_learners=4, overlap_steps=3, fragments=2)
  syncer.observe_round(2.0)  # 3 overlap steps of 2 s hide 6 s
  syncer.observe_sync(1.0)
  for learner, sent_at, fragment in [(0, 5.0, 1), (1, 10.0, 0), (2, 12.0, 0)]:
    syncer.receive(Report(learner, None, 1, 1, 0, loss=1.0, sent_at=sent_at, fragment=fragment))
  assert syncer.ready([2, 2]) == 0
  syncer.observe_quorum(13.0, fragment=0)  # 3 s after fragment 0's first report
  assert syncer.grace_seconds(13.0, needs_theta_at=[100.0]) == pytest.approx(2.0)  # 6 - 3 - 1

"""The syncer's outer step: screening, weighting, scaling by the merged fraction."""

import dataclasses

import jax.numpy as jnp
import numpy as np

from runtime.config import OuterConfig
from runtime.syncer import Report, Syncer


def _report(learner, params, tokens=100, steps=10, base=0):
  return Report(learner, params, tokens, steps, base, loss=1.0, sent_at=0.0)


def _syncer(**outer):
  cfg = dataclasses.replace(OuterConfig(lr=1.0, momentum=0.0, nesterov=False, merge="mean"), **outer)
  return Syncer(cfg, {"w": jnp.zeros(3)}, num_learners=4, quarantine_factor=100.0, max_delta_norm=1e6)


def test_a_merge_of_one_of_four_learners_is_a_quarter_outer_step():
  theta_local = {"w": jnp.array([4.0, 0.0, -8.0])}
  full = _syncer(scale="none").compute([_report(0, theta_local)])
  quarter = _syncer(scale="fraction").compute([_report(0, theta_local)])
  np.testing.assert_allclose(full.params["w"], [4.0, 0.0, -8.0])
  np.testing.assert_allclose(quarter.params["w"], [1.0, 0.0, -2.0])


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
  syncer.commit(syncer.compute([_report(0, {"w": jnp.full(3, 1.0)})]), [0])  # Θ = 1, recent norm sqrt(3)
  assert syncer.compute([_report(1, {"w": jnp.full(3, 51.0)})]).merged == (1,)  # 50 × recent: kept
  result = syncer.compute([_report(1, {"w": jnp.full(3, 201.0)})])  # 200 × recent, far below 1e6
  assert result.merged == ()
  (learner, reason), = result.quarantined
  assert learner == 1 and "recent norm" in reason

"""Property tests for merging outer gradients: token weighting, weighted mean, RDA, quarantine."""

from typing import Any

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runtime.diloco.sync import averaging
# Every distinct (learner count, leaf shapes) pair costs one compilation, so both come from
# small fixed sets and the examples vary only the values.
PROPERTY = settings(max_examples=25, deadline=None)
LEAF_SHAPES = ((2, 3), (4,))
EMBED_PATH = "params/embed/embedding"
KERNEL_PATH = "params/dense/kernel"

Report = tuple[list[Any], np.ndarray]


def _tree(embedding: np.ndarray, kernel: np.ndarray) -> dict[str, Any]:
  """Returns a two-leaf delta shaped like a model's: one embedding table, one kernel."""
  return {"params": {"embed": {"embedding": embedding}, "dense": {"kernel": kernel}}}


def _leaves(tree: Any) -> list[np.ndarray]:
  """Returns a tree's leaves as float64 NumPy arrays, in path order."""
  return [np.asarray(leaf, np.float64) for leaf in jax.tree.leaves(tree)]


@st.composite
def _deltas(draw: st.DrawFn, learners: int, low: float, high: float) -> list[Any]:
  """Draws one delta per learner with entries in [low, high]."""
  entries = st.floats(low, high, width=32, allow_subnormal=False)  # (XLA:CPU flushes subnormals to zero)
  return [_tree(*(draw(hnp.arrays(np.float32, shape, elements=entries)) for shape in LEAF_SHAPES))
          for _ in range(learners)]


def _weights(learners: int) -> st.SearchStrategy[np.ndarray]:
  """Returns a strategy for one positive weight per learner."""
  return hnp.arrays(np.float32, (learners,), elements=st.floats(0.125, 10.0, width=32))


@st.composite
def reports(draw: st.DrawFn, low: float = -10.0, high: float = 10.0) -> Report:
  """Draws 2 or 3 learners' deltas and their positive weights."""
  learners = draw(st.sampled_from([2, 3]))
  return draw(_deltas(learners, low, high)), draw(_weights(learners))


# Entries of one sign keep the learners' directions from cancelling, where RDA's direction is
# ill-conditioned and a rounding-level change of the inputs may turn it arbitrarily.
aligned_reports = reports(low=0.5, high=10.0)


def assert_trees_close(actual: Any, expected: Any, atol: float = 1e-5) -> None:
  """Asserts two trees have the same structure and close leaves."""
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  for a, e in zip(_leaves(actual), _leaves(expected)):
    np.testing.assert_allclose(a, e, rtol=1e-5, atol=atol)


# Token weighting.


def test_token_weight_matches_hand_computed_values():
  tokens = jnp.array([1000.0, 2000.0, 0.0, 500.0])
  steps = jnp.array([10.0, 10.0, 0.0, 0.0])
  # 1000 * (1000 / 10) and 2000 * (2000 / 10); no steps or no tokens weigh nothing.
  np.testing.assert_allclose(averaging.token_weight(tokens, steps), [100_000.0, 400_000.0, 0.0, 0.0])
  np.testing.assert_allclose(averaging.token_weight(600, 3), 120_000.0)


def test_token_weight_favours_quality_at_equal_quantity():
  # Same tokens in fewer steps means larger batches, so the report is worth more.
  assert averaging.token_weight(1000, 5) > averaging.token_weight(1000, 10)


# Weighted mean.


@PROPERTY
@given(reports())
def test_weighted_mean_matches_numpy_reference(report: Report):
  deltas, weights = report
  probs = weights.astype(np.float64) / weights.sum(dtype=np.float64)
  per_learner = [_leaves(delta) for delta in deltas]
  expected = [sum(p * leaves[i] for p, leaves in zip(probs, per_learner))
              for i in range(len(LEAF_SHAPES))]
  for actual, want in zip(_leaves(averaging.weighted_mean(deltas, jnp.asarray(weights))), expected):
    np.testing.assert_allclose(actual, want, rtol=1e-5, atol=1e-4)


# RDA.


def test_rda_matches_hand_computed_example():
  deltas = [{"w": jnp.array([3.0, 4.0])}, {"w": jnp.array([0.0, 2.0])}]
  # Weights 1 and 3 normalise to 1/4 and 3/4. Norms 5 and 2 average to 5/4 + 6/4 = 2.75.
  # Directions (0.6, 0.8) and (0, 1) average to (0.15, 0.95), of norm sqrt(0.925).
  expected = 2.75 * np.array([0.15, 0.95]) / np.sqrt(0.925)
  np.testing.assert_allclose(averaging.rda(deltas, jnp.array([1.0, 3.0]))["w"], expected, rtol=1e-6)
  np.testing.assert_allclose(expected, [0.428897, 2.716348], rtol=1e-6)


def test_rda_zero_delta_contributes_only_its_zero_norm():
  deltas = [{"w": jnp.array([3.0, 4.0])}, {"w": jnp.zeros(2)}]
  # Radius (5 + 0) / 2; the direction is the first learner's alone.
  np.testing.assert_allclose(averaging.rda(deltas, jnp.array([1.0, 1.0]))["w"], [1.5, 2.0], rtol=1e-6)


def test_rda_keeps_norm_where_mean_shrinks_for_orthogonal_deltas():
  deltas = [{"w": jnp.array([1.0, 0.0])}, {"w": jnp.array([0.0, 1.0])}]
  weights = jnp.array([1.0, 1.0])
  np.testing.assert_allclose(jnp.linalg.norm(averaging.rda(deltas, weights)["w"]), 1.0, rtol=1e-6)
  np.testing.assert_allclose(jnp.linalg.norm(averaging.weighted_mean(deltas, weights)["w"]),
                             np.sqrt(0.5), rtol=1e-6)


@PROPERTY
@given(_deltas(1, -10.0, 10.0), st.sampled_from([2, 3]), st.data())
def test_rda_of_identical_deltas_returns_that_delta(single: list[Any], learners: int,
                                                    data: st.DataObject):
  weights = data.draw(_weights(learners))
  assert_trees_close(averaging.rda(single * learners, jnp.asarray(weights)), single[0])


@PROPERTY
@given(aligned_reports)
def test_rda_norm_is_weighted_mean_of_norms(report: Report):
  deltas, weights = report
  probs = weights.astype(np.float64) / weights.sum(dtype=np.float64)
  per_learner = [_leaves(delta) for delta in deltas]
  for i, leaf in enumerate(_leaves(averaging.rda(deltas, jnp.asarray(weights)))):
    expected = sum(p * np.linalg.norm(leaves[i]) for p, leaves in zip(probs, per_learner))
    np.testing.assert_allclose(np.linalg.norm(leaf), expected, rtol=1e-5)


# Properties both methods share.

METHODS = pytest.mark.parametrize("method", averaging.MERGE_METHODS)


@METHODS
@PROPERTY
@given(aligned_reports, st.floats(1e-3, 1e3))
def test_merge_is_invariant_to_positive_weight_scaling(method: str, report: Report, scale: float):
  deltas, weights = report
  assert_trees_close(averaging.merge(deltas, jnp.asarray(weights * np.float32(scale)), method=method),
                     averaging.merge(deltas, jnp.asarray(weights), method=method))


@METHODS
@PROPERTY
@given(aligned_reports, st.data())
def test_merge_is_invariant_to_learner_order(method: str, report: Report, data: st.DataObject):
  deltas, weights = report
  order = data.draw(st.permutations(range(len(deltas))))
  assert_trees_close(
      averaging.merge([deltas[i] for i in order], jnp.asarray(weights[order]), method=method),
      averaging.merge(deltas, jnp.asarray(weights), method=method))


@METHODS
@PROPERTY
@given(aligned_reports, _deltas(1, -1e3, 1e3))
def test_zero_weight_learner_has_no_effect(method: str, report: Report, ignored: list[Any]):
  deltas, weights = report
  assert_trees_close(
      averaging.merge(deltas + ignored, jnp.asarray(np.append(weights, np.float32(0.0))),
                  method=method),
      averaging.merge(deltas, jnp.asarray(weights), method=method))


@METHODS
def test_all_zero_weights_merge_to_zero(method: str):
  deltas = [{"w": jnp.array([3.0, 4.0])}, {"w": jnp.array([1.0, 2.0])}]
  np.testing.assert_array_equal(averaging.merge(deltas, jnp.zeros(2), method=method)["w"], [0.0, 0.0])


def test_merge_keeps_leaf_dtype():
  deltas = [{"w": jnp.array([3.0, 4.0], jnp.bfloat16)}, {"w": jnp.array([1.0, 2.0], jnp.bfloat16)}]
  assert averaging.merge(deltas, jnp.array([1.0, 1.0]))["w"].dtype == jnp.bfloat16


def test_merge_rejects_unknown_method():
  with pytest.raises(ValueError, match="'median'"):
    averaging.merge([{"w": jnp.ones(2)}], jnp.ones(1), method="median")


def test_merge_rejects_weight_count_mismatch():
  with pytest.raises(ValueError, match="one weight per delta"):
    averaging.merge([{"w": jnp.ones(2)}, {"w": jnp.ones(2)}], jnp.ones(3))


# Routing embeddings to the plain mean.


def test_is_embedding_matches_embedding_paths_only():
  assert averaging.is_embedding(EMBED_PATH)
  assert not averaging.is_embedding(KERNEL_PATH)


@PROPERTY
@given(reports())
def test_mean_for_routes_embedding_leaf_to_plain_mean(report: Report):
  deltas, weights = report
  weights = jnp.asarray(weights)
  merged = averaging.merge(deltas, weights, mean_for=averaging.is_embedding)
  mean, rda = averaging.weighted_mean(deltas, weights), averaging.rda(deltas, weights)
  assert_trees_close(merged["params"]["embed"], mean["params"]["embed"])
  assert_trees_close(merged["params"]["dense"], rda["params"]["dense"])


# Quarantine checks.


@PROPERTY
@given(_deltas(1, -10.0, 10.0), st.sampled_from([np.nan, np.inf, -np.inf]), st.data())
def test_delta_is_finite_flags_any_nan_or_inf(single: list[Any], bad: float, data: st.DataObject):
  delta = single[0]
  assert averaging.delta_is_finite(delta)
  leaves, treedef = jax.tree.flatten(delta)
  leaf = data.draw(st.integers(0, len(leaves) - 1))
  corrupt = np.array(leaves[leaf])
  corrupt.flat[data.draw(st.integers(0, corrupt.size - 1))] = bad
  leaves[leaf] = corrupt
  assert not averaging.delta_is_finite(jax.tree.unflatten(treedef, leaves))


@PROPERTY
@given(_deltas(1, -10.0, 10.0))
def test_global_norm_matches_numpy(single: list[Any]):
  flat = np.concatenate([leaf.ravel() for leaf in _leaves(single[0])])
  # (fp32 squares below 1.2e-38 underflow: a norm under ~1e-19 is 0 in fp32, and numpy's is in float64)
  np.testing.assert_allclose(averaging.global_norm(single[0]), np.linalg.norm(flat), rtol=1e-5, atol=1e-18)

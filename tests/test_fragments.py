"""Fragments: greedy packing covers every tensor once, stays balanced, and staggers the syncs."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from runtime import fragments
from runtime.errors import ConfigError


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=60), st.integers(1, 12))
def test_packing_puts_every_tensor_in_exactly_one_fragment(sizes, num_fragments):
  groups = fragments.pack(sizes, num_fragments)
  assert len(groups) == num_fragments
  assert sorted(i for g in groups for i in g) == list(range(len(sizes)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=60), st.integers(1, 12))
def test_fragments_are_balanced_within_the_largest_tensor(sizes, num_fragments):
  loads = [sum(sizes[i] for i in g) for g in fragments.pack(sizes, num_fragments)]
  assert max(loads) - min(loads) <= max(sizes)


def test_packing_is_deterministic_and_breaks_ties_by_tensor_then_fragment():
  assert fragments.pack([4, 4, 4, 4], 2) == ((0, 2), (1, 3))
  assert fragments.pack([1, 9, 3, 5], 2) == fragments.pack([1, 9, 3, 5], 2) == ((1,), (0, 2, 3))


def test_more_fragments_than_tensors_leaves_some_empty():
  assert fragments.pack([3, 2], 3) == ((0,), (1,), ())


def test_a_fragment_count_below_one_is_a_config_error():
  with pytest.raises(ConfigError, match="fragments"):
    fragments.pack([1], 0)


def test_fragment_paths_name_the_models_tensors():
  tree = {"embed": np.zeros((256, 8)), "blocks": [{"w": np.zeros((8, 32))}, {"w": np.zeros((8, 32))}],
          "out": np.zeros(8)}
  groups = fragments.fragment_paths(tree, 2)
  assert sorted(p for g in groups for p in g) == ["blocks/0/w", "blocks/1/w", "embed", "out"]
  assert groups[0] == ("embed",)


@pytest.mark.parametrize("inner_steps,num_fragments", [(24, 24), (30, 4), (10, 3), (5, 1)])
def test_each_fragment_syncs_once_every_h_steps_at_its_staggered_offset(inner_steps, num_fragments):
  steps = range(1, 3 * inner_steps + 1)
  for p in range(num_fragments):
    due = [t for t in steps if fragments.sync_due(t, p, inner_steps, num_fragments)]
    offset = p * inner_steps // num_fragments
    assert fragments.sync_offset(p, inner_steps, num_fragments) == offset
    assert len(due) == 3 and all(t % inner_steps == offset for t in due)
    assert np.all(np.diff(due) == inner_steps)

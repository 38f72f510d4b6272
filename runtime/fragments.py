"""Fragments (Streaming DiLoCo): the parameters split into P balanced groups of whole tensors, each synced on
its own staggered schedule, so that no sync moves more than about 1/P of the model.

Packing is greedy: tensors largest first, each into the lightest fragment so far (ties: the earlier tensor,
the lower fragment), which leaves the fragments within one largest tensor of each other.
"""

from typing import Any, Sequence

import jax

from runtime.errors import check

PyTree = Any


def pack(sizes: Sequence[int], num_fragments: int) -> tuple[tuple[int, ...], ...]:
  """The tensor indices of each of `num_fragments` fragments (each sorted), every tensor in exactly one."""
  check(num_fragments >= 1, "fragments", num_fragments, "an integer >= 1")
  loads = [0] * num_fragments
  members: list[list[int]] = [[] for _ in range(num_fragments)]
  for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
    p = min(range(num_fragments), key=lambda p: (loads[p], p))
    loads[p] += sizes[i]
    members[p].append(i)
  return tuple(tuple(sorted(m)) for m in members)


def fragment_paths(tree: PyTree, num_fragments: int) -> tuple[tuple[str, ...], ...]:
  """Each fragment's tensors by path ("blocks/0/mlp/w"), packed by their number of elements."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  paths = [jax.tree_util.keystr(path, simple=True, separator="/") for path, _ in leaves]
  groups = pack([int(getattr(x, "size", 1)) for _, x in leaves], num_fragments)
  return tuple(tuple(paths[i] for i in group) for group in groups)


def sync_offset(fragment: int, inner_steps: int, num_fragments: int) -> int:
  """Fragment p's sync offset within every H inner steps: p·H/P (rounded down)."""
  return fragment * inner_steps // num_fragments


def sync_due(step: int, fragment: int, inner_steps: int, num_fragments: int) -> bool:
  """Whether fragment p syncs after inner step `step` (counted from 1): at every step ≡ p·H/P (mod H)."""
  return step >= 1 and (step - sync_offset(fragment, inner_steps, num_fragments)) % inner_steps == 0

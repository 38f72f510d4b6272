"""Fragments (Streaming DiLoCo): the parameters split into P balanced groups of whole tensors, each synced on
its own staggered schedule, so that no sync moves more than about 1/P of the model.

Packing is greedy: tensors largest first, each into the lightest fragment so far (ties: the earlier tensor,
the lower fragment), which leaves the fragments within one largest tensor of each other.

What runs (modes decoupled and diloco_sync, `fragments` = P > 1): a learner's round is H/P inner steps (a main
part of H/P − τ, then τ overlap steps), and the report that closes it carries one fragment's tensors: its n-th
report (n = 0, 1, ...) carries fragment `fragment_of(n, P)`, so the report after inner step t = (n+1)·H/P carries
the fragment p with `sync_due(t, p, H, P)`: each fragment syncs every H inner steps, fragment p at offset p·H/P.
The syncer merges each fragment with its own quorum, grace window and outer-optimizer state; see
runtime/diloco/sync/syncer.py. Θ of one fragment comes back only to the report's learner and replaces that fragment's
tensors (carried, mixed or overwritten per outer.receive); the other fragments keep their local progress.

Accounting: a report's `tokens` and `steps` are its round's (each round's data counts once, merged when its
report merges; a quarantined or lost report's round is trained again as without fragments), while its merge
weight reads `fragment_tokens` / `fragment_steps`, what the fragment trained on since the learner received it
(about P rounds). Overlap steps always open the next round (none is served again on receipt of a fragment).
Θ whole (a start, rejoin, quarantined or lost report) resets every fragment: progress that the learner's earlier
rounds left in fragments it had not synced yet is dropped then, though those rounds' data counts as merged.

P = 1 is the unfragmented runtime, bit for bit. This module imports no JAX (the config boundary validates with
it); the tree side is runtime/diloco/sync/fragment_trees.py.
"""

from typing import Any, Sequence

from runtime.errors import check

WHOLE = -1  # a Delivery's `fragment` when it carries Θ whole (every delivery while P = 1)


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


def fragment_of(report_number: int, num_fragments: int) -> int:
  """The fragment a learner's `report_number`-th report (from 0) carries: the one due after its inner steps."""
  return (report_number + 1) % num_fragments


def sync_offset(fragment: int, inner_steps: int, num_fragments: int) -> int:
  """Fragment p's sync offset within every H inner steps: p·H/P (rounded down)."""
  return fragment * inner_steps // num_fragments


def sync_due(step: int, fragment: int, inner_steps: int, num_fragments: int) -> bool:
  """Whether fragment p syncs after inner step `step` (counted from 1): at every step ≡ p·H/P (mod H)."""
  return step >= 1 and (step - sync_offset(fragment, inner_steps, num_fragments)) % inner_steps == 0


def validate(run: Any) -> None:
  """Raises ConfigError unless `fragments` divides H, leaves room for τ, and runs with what fragments support."""
  p = run.fragments
  check(p >= 1, "fragments", p, "an integer >= 1")
  check(run.inner_steps % p == 0, "fragments", p, f"a divisor of inner_steps ({run.inner_steps})")
  if p == 1:
    return
  tensors = run.model.num_tensors()
  check(p <= tensors, "fragments", p, f"at most the model's {tensors} parameter tensors (a fragment holds whole "
        "tensors, packed by size: fragments need not hold equally many, and none may be empty)")
  check(run.overlap_steps < run.inner_steps // p, "overlap_steps", run.overlap_steps,
        f"0 <= overlap_steps < inner_steps / fragments ({run.inner_steps} / {p}) while fragments > 1")
  unsupported = [
      (run.mode in ("decoupled", "diloco_sync"), "mode", run.mode, "decoupled or diloco_sync"),
      (run.compression.up == "none", "compression.up", run.compression.up, "'none' (compressed fragment reports "
       "are not built yet)"),
      (run.compression.down == "none", "compression.down", run.compression.down, "'none' (a learner's Θ̃ mirror "
       "is kept whole)"),
      (run.slices_per_learner == 1, "slices_per_learner", run.slices_per_learner, "1"),
      (not run.lent_slices, "capacity.schedule", run.capacity.schedule, "empty (lent learners are untested)"),
  ]
  for ok, field, value, allowed in unsupported:
    check(ok, field, value, f"{allowed} while fragments = {p} > 1")

"""Learners of several slices (slices_per_learner = k > 1): which slices each starts on, and the settings they need.

Pure bookkeeping, checked at the config boundary (no JAX). Learner m starts on slices [m·k, (m+1)·k); the slices
after the learners' are spares. A learner of one slice (k = 1) is the runtime as it always was.
"""

import math

from runtime.errors import check

MODES = ("decoupled", "diloco_sync")  # modes whose learners may span several slices


def home(learner: int, per_learner: int) -> tuple[int, ...]:
  """The slices learner `learner` starts on."""
  return tuple(range(learner * per_learner, (learner + 1) * per_learner))


def validate(run) -> None:
  """slices_per_learner against the mode, the lent capacity, the devices and the batch."""
  k = run.slices_per_learner
  check(k >= 1, "slices_per_learner", k, "an integer >= 1")
  if k == 1:
    return
  check(run.mode in MODES, "slices_per_learner", k, f"1 in mode '{run.mode}' (learners of several slices run in "
        f"modes {MODES})")
  check(not run.capacity.schedule, "capacity.schedule", "; ".join(l.text for l in run.capacity.schedule),
        f"empty with slices_per_learner = {k} (a lent slice runs a learner of one slice: set slices_per_learner=1)")
  check(run.learners * k <= run.num_devices, "slices_per_learner", k, f"at most num_devices / learners "
        f"({run.num_devices} / {run.learners}): every slice needs a device")
  check(run.slices == 0 or run.slices >= run.learners * k, "slices", run.slices,
        f"0 or at least learners × slices_per_learner ({run.learners} × {k})")
  shrinks = math.lcm(*range(1, k + 1))  # the batch splits evenly over every slice count it may shrink to
  if run.faults.learner_recovery == "reconfigure" and shrinks > k and run.num_devices % run.num_slices == 0:
    per_slice = run.num_devices // run.num_slices
    for m in range(run.learners):
      field = "data.learner_batches" if run.data.learner_batches else "data.batch_size"
      check(run.learner_batch(m) % (per_slice * shrinks) == 0, field, getattr(run.data, field[5:]),
            f"per-learner batches that are multiples of devices per slice ({per_slice}) × {shrinks}, so that a "
            f"learner of {k} slices splits its batch evenly over any {tuple(range(1, k + 1))} of them "
            "(faults.learner_recovery='reconfigure')")

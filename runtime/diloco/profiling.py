"""A profile on request (`--config.profile_rounds=N`): a `jax.profiler` trace of N rounds of every learner.

The trace starts when training starts (after the learners' programs are compiled) and stops once every learner
still training has adopted Θ N times since, or when the run ends. It is written under `<run>/profile/` as
`plugins/profile/<time>/<host>.xplane.pb` (TensorBoard's profile plugin or xprof: `tensorboard --logdir <run>/profile`)
and `perfetto_trace.json.gz` beside it (open it at https://ui.perfetto.dev). The controller's work is annotated:
`controller/<event kind>` for each event it handles, `syncer/report_copy`, `syncer/merge` and `syncer/theta_copy`
in the merge worker, `learner<m>/dispatch` and `learner<m>/adopt` on the controller for each learner.
"""

import logging
import pathlib
import threading
from typing import Sequence

import jax

from runtime.diloco.learner.lifecycle import ABSENT, DONE, DOWN, FAILED

annotate = jax.profiler.TraceAnnotation  # a named span in the trace (near free while no trace is taken)


class RoundsProfile:
  """Takes the trace of the first `rounds` rounds of every learner; `rounds` 0 takes none."""

  def __init__(self, rounds: int, directory: pathlib.Path | None):
    self._rounds, self.directory = rounds, directory
    self._until: dict[int, int] = {}  # learner -> the round at which its share of the trace is taken
    self.active = False
    self._writer: threading.Thread | None = None

  def start(self, learners: Sequence) -> None:
    if not self._rounds or self.directory is None:
      return
    self._until = {l.index: l.round + self._rounds for l in learners}
    self.directory.mkdir(parents=True, exist_ok=True)
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # every Python call traced slows the controller severalfold: annotations only
    jax.profiler.start_trace(str(self.directory), create_perfetto_trace=True, profiler_options=options)
    self.active = True

  def observe(self, learners: Sequence) -> None:
    """Stops the trace once every learner still training has completed its rounds."""
    if self.active and all(l.round >= self._until.get(l.index, 0) or l.status in (DONE, DOWN, FAILED, ABSENT)
                           for l in learners):
      self.stop()

  def stop(self) -> None:
    """Ends the trace; it is written on a thread of its own (seconds of serializing that no learner waits for)."""
    if self.active:
      self.active = False
      self._writer = threading.Thread(target=jax.profiler.stop_trace, name="profile-writer")
      self._writer.start()
      logging.info("profile of %d rounds of every learner: %s", self._rounds, self.directory)

  def close(self) -> None:
    """Stops the trace if it runs, and waits until it is written."""
    self.stop()
    if self._writer is not None:
      self._writer.join()
      self._writer = None

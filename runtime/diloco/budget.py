"""The token budget and every loss of work: one owner for what is dispatched, on its way, and lost.

Tokens dispatched count against the run's budget; work that never reaches Θ (a crash, a reclaimed slice, a
quarantined report, overlap steps that Θ replaced) is lost through `lose`: its fault recorded, its tokens back in the
budget (finished learners take them up again, from the current Θ) and its slice time booked lost in the ledger.
"""

from typing import Sequence

from runtime.config.run import RunConfig
from runtime.diloco.ledger import Ledger
from runtime.diloco.learner.interface import LearnerPort
from runtime.diloco.learner.lifecycle import DONE
from runtime.diloco.run_log import RunLog
from runtime.diloco.sync.syncer import Syncer
from runtime.diloco.theta_post import ThetaPost


class Budget:
  """Tokens dispatched, reports in transit to the syncer, and the ledger of slice time (useful, lost, lent)."""

  def __init__(self, run: RunConfig, clock, learners: Sequence[LearnerPort], syncer: Syncer, post: ThetaPost,
               ledger: Ledger, log: RunLog):
    self._run, self._clock, self._learners, self._syncer, self._post = run, clock, learners, syncer, post
    self.ledger, self._log = ledger, log
    self.tokens_dispatched = 0
    self.reports_in_transit = 0

  def work_left(self) -> bool:
    """True while the token budget is not all dispatched."""
    return self.tokens_dispatched < self._run.token_budget

  def steps_left(self, learner: LearnerPort) -> int:
    """Whole inner steps of the learner's batch that the budget still holds."""
    return (self._run.token_budget - self.tokens_dispatched) // learner.tokens_per_batch

  def schedule_step(self) -> int:
    """Global batches' worth of tokens dispatched so far: where the run's inner schedule stands."""
    return self.tokens_dispatched // self._run.tokens_per_step

  def dispatched(self, tokens: int) -> None:
    self.tokens_dispatched += tokens

  def report_sent(self) -> None:
    self.reports_in_transit += 1

  def report_arrived(self) -> None:
    self.reports_in_transit -= 1

  def lose(self, tokens: int, seconds: float, fault: tuple[str, int, str] | None = None) -> None:
    """Work lost before it reached Θ: the fault (kind, learner, detail) recorded, its `tokens` back into the budget
    (their data is served again) and its `seconds` of slice time booked lost."""
    if fault is not None:
      self._log.fault(fault[0], fault[1], self._clock.now(), fault[2], tokens_written_off=int(tokens),
                      slice_seconds_lost=float(seconds))
    self.tokens_dispatched -= tokens
    for learner in self._learners:
      if tokens and learner.status == DONE:  # finished learners take the returned budget, from the current Θ
        learner.wait(self._clock.now())
        self._post.send(learner.index, self._syncer.latest(learner.round))  # pulled whole
    self.ledger.lost(seconds, tokens)

  def snapshot(self, packer) -> dict:
    del packer  # (plain data)
    return dict(tokens_dispatched=self.tokens_dispatched, reports_in_transit=self.reports_in_transit,
                ledger=self.ledger.snapshot())

  def restore(self, saved: dict, unpacker) -> None:
    del unpacker
    self.tokens_dispatched, self.reports_in_transit = saved["tokens_dispatched"], saved["reports_in_transit"]
    self.ledger.restore(saved["ledger"])

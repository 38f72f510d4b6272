"""The learners' rounds within the token budget: dispatching their parts, their reports up, and Θ down to them.

Each learner's round is a main part of H − τ steps that ends in a report and an overlap part of τ steps that trains
while the report syncs; the learner adopts the Θ that answers it and starts its next round. What comes next and for
how long is the round plan's (runtime/diloco/round_plan.py). With two parts in flight (`queue_depth`), a learner's
next part is enqueued while the current one runs whenever the plan knows it from the newest part in flight, so its
device never waits for the controller to handle a completion.
"""

import time
from typing import Sequence

from runtime.config.run import RunConfig
from runtime.diloco.budget import Budget
from runtime.diloco.clock import Event, EventKind
from runtime.diloco import round_plan
from runtime.diloco.learner.interface import LearnerPort, Part
from runtime.diloco.learner.lifecycle import RECONFIGURING, TRAINING, WAITING
from runtime.diloco.profiling import annotate
from runtime.diloco.round_plan import MAIN, OVERLAP
from runtime.diloco.run_log import RunLog
from runtime.diloco.slices.lifecycle import SliceLifecycle
from runtime.diloco.sync.messages import Delivery
from runtime.diloco.sync.syncer import Syncer
from runtime.diloco.theta_post import ThetaPost
from runtime.network.links import Links
from runtime.wire.payload import CorruptPayload


def queue_depth(run: RunConfig) -> int:
  """The parts a learner keeps in flight: `parts_in_flight`, or by the clock (0). One where a learner keeps the state
  before its part (several slices). Behind a part armed to crash none is queued (SliceLifecycle.doomed)."""
  if run.slices_per_learner > 1:
    return 1
  return run.parts_in_flight or (2 if run.clock.kind == "real" else 1)


class Rounds:
  """Dispatches the learners' parts within the budget, sends their reports up, and hands them the Θ that arrives."""

  def __init__(self, run: RunConfig, clock, learners: Sequence[LearnerPort], syncer: Syncer, links: Links,
               budget: Budget, post: ThetaPost, log: RunLog, slices: SliceLifecycle):
    self._run, self._clock, self._learners, self._syncer, self._links = run, clock, learners, syncer, links
    self._budget, self._post, self._log = budget, post, log
    self._slices = slices
    self._depth = queue_depth(run)
    self._deadlines = round_plan.Deadlines(run, clock) if run.rounds.length == "time" else None

  # Dispatch ----------------------------------------------------------------------------------------

  def _next(self, learner: LearnerPort, newest: str) -> round_plan.Next:
    """The round plan's next step for the learner, after a part of kind `newest` ("": a new round, which starts when
    its parts in flight end)."""
    in_flight = learner.parts_in_flight() > 0
    deadline = None
    if not newest and self._deadlines is not None:
      now = self._clock.now()
      deadline = self._deadline(learner, learner.parts_end_at(self._step_seconds(learner)) if in_flight else now)
    view = round_plan.View(newest=newest, has_theta=learner.has_theta(), in_flight=in_flight,
                           steps_left=self._budget.steps_left(learner), unreported_tokens=learner.tokens,
                           deadline=deadline)
    return round_plan.next_part(self._run, view)

  def _step_seconds(self, learner: LearnerPort) -> float:
    """rounds.length "time": the learner's step time the plan goes by."""
    return self._deadlines.seconds_per_step(learner.index, self._slices.step_scale(learner))

  def _deadline(self, learner: LearnerPort, start: float) -> round_plan.Deadline | None:
    return self._deadlines.of(learner.index, start, self._slices.step_scale(learner))

  def _ahead(self, learner: LearnerPort, kind: str, steps: int, now: float, modeled: float) -> int | None:
    """rounds.length "time": the steps of the part the learner stages after this one, planned as if the next round
    starts when this part ends (None under "steps": the learner's own look-ahead is exact)."""
    if self._deadlines is None:
      return None
    xi = self._step_seconds(learner)
    ends = (learner.parts_end_at(xi) if learner.parts_in_flight() else now) + (modeled or steps * xi)
    return round_plan.staged_after(self._run, kind, learner.has_theta(), self._deadline(learner, ends))

  def start_round(self, learner: LearnerPort) -> None:
    """Dispatches the main part (round_plan: H − τ steps, or the whole steps left of the budget if fewer), or sends
    the budget's last report."""
    then = self._next(learner, "")
    if then.action == round_plan.REPORT:  # the budget is spent: report the overlap work carried onto Θ
      self._send_report(learner, self._clock.now())
      return
    if self._dispatch(learner, MAIN, then.steps):
      self.top_up(learner)

  def top_up(self, learner: LearnerPort) -> None:
    """Queues the learner's next parts behind those in flight, up to the queue depth, while what comes next is
    known (see the module's docstring)."""
    while (0 < learner.parts_in_flight() < self._depth and learner.status == TRAINING
           and not self._slices.doomed(learner)):
      newest = learner.newest_part()
      then = self._next(learner, newest)
      if then.action == round_plan.ADOPT:
        self._adopt(learner)  # enqueued behind the running part, and the next round's main part with it
        return
      if then.action != OVERLAP:
        return  # it waits: for Θ, or for its parts in flight (the budget's last report)
      if newest == MAIN:
        learner.capture_report()  # before the overlap part donates the main part's state
      if not self._dispatch(learner, OVERLAP, then.steps):
        return

  def _dispatch(self, learner: LearnerPort, kind: str, steps: int) -> bool:
    """Dispatches a part of the learner's round within the token budget; False if none was dispatched."""
    tokens = steps * learner.tokens_per_batch
    if steps > self._budget.steps_left(learner):
      if learner.parts_in_flight():  # (it settles when they are done)
        return False
      if kind == MAIN:  # (a finished learner lowers the effective quorum: the loop's merge check sees it)
        learner.finish(self._clock.now())
      else:
        learner.wait(self._clock.now())
      return False
    if self._slices.regroup_due(learner, kind):  # a learner of several slices grows onto those given back first
      return True
    now = self._clock.now()
    modeled = sum(self._clock.step_seconds(learner.index) for _ in range(steps)) * self._slices.step_scale(learner)
    crash_at = self._slices.arm_crash(learner, steps, modeled)
    try:
      at = self._budget.schedule_step() if self._run.inner.schedule_progress == "run" else None
      with annotate(f"learner{learner.index}/dispatch"):
        part = learner.dispatch(kind, steps, now, modeled, armed=crash_at is not None, schedule_at=at,
                                ahead=self._ahead(learner, kind, steps, now, modeled))
    except Exception as error:  # pylint: disable=broad-except
      if not self._slices.hold_stop(learner, "at dispatch", error):
        self._slices.failed(learner, "at dispatch", error)
      return False
    self._budget.dispatched(tokens)
    self._clock.on_done(part.future, part.queued_seconds + modeled,
                        Event(EventKind.PART_DONE, learner.index))
    return True

  def on_part_done(self, event: Event, now: float) -> None:
    """`now`: when the part's program finished (its busy time ends then, not when the controller got to it)."""
    learner = self._learners[event.learner]
    try:
      part = learner.collect(now)
    except Exception as error:  # pylint: disable=broad-except
      self._slices.failed(learner, "awaiting its round", error)
      return
    self._continue(learner, part, now)
    self._slices.crashed_idle(learner)  # (real clock) a crash armed after the part's last step: now, if none runs

  def _continue(self, learner: LearnerPort, part: Part, now: float) -> None:
    """After a part: its report sent (a main part's), and the learner's next part dispatched, or it waits."""
    self._syncer.observe_round(learner.seconds_per_step(part))
    if self._deadlines is not None:
      self._deadlines.observe(learner.index, learner.seconds_per_step(part))
    if part.kind == MAIN:
      self._send_report(learner, now)
    if self._slices.stop_held(learner):  # a program error held at a queued dispatch: the parts ahead are done
      return
    if learner.parts_in_flight():  # its next part runs already
      self.top_up(learner)
      return
    then = self._next(learner, part.kind)
    if then.action == round_plan.ADOPT:
      self._adopt(learner)
      return
    if then.action == OVERLAP and self._dispatch(learner, OVERLAP, then.steps):
      self.top_up(learner)
    elif learner.status == TRAINING:
      learner.wait(now)  # (a dispatch that failed left it down or failed, or done)

  def on_reconfigured(self, event: Event) -> None:
    """A learner of several slices moved onto the slices it holds: it resumes what it was about to do."""
    learner = self._learners[event.learner]
    self._slices.regroup(learner)
    if learner.has_theta():  # Θ arrived meanwhile
      self._adopt(learner)
    elif event.payload == MAIN:
      self.start_round(learner)
    elif event.payload == OVERLAP:  # its overlap part is lost: what follows its main part, again
      self._dispatch(learner, OVERLAP, self._next(learner, MAIN).steps)
    else:
      learner.wait(self._clock.now())

  # Reports up ---------------------------------------------------------------------------------------

  def _send_report(self, learner: LearnerPort, now: float) -> None:
    started = time.perf_counter()
    report = learner.report(now)
    self._log.spent("report", time.perf_counter() - started)
    delay = self._links.send_up(learner.index, now, report.payload, report.fragment)
    if delay is None:  # as if never sent: the learner times out and trains it again
      self._budget.lose(0, report.busy_seconds, ("link_drop", learner.index, f"report of {report.tokens} tokens lost"))
      self._clock.after(self._run.faults.report_timeout_seconds,
                        Event(EventKind.REPORT_TIMEOUT, learner.index, report))
      return
    learner.report_sent(report)
    self._budget.report_sent()
    self._clock.after(delay, Event(EventKind.REPORT_ARRIVED, learner.index, report))

  def on_report_arrived(self, event: Event) -> None:
    self._budget.report_arrived()
    self._syncer.receive(event.payload)  # it waits for its fragment's merge (the loop's merge check follows)

  def on_report_timeout(self, event: Event) -> None:
    """A learner whose report was lost pulls the current Θ (charged on its path) and trains that data again."""
    self._post.send(event.learner, self._syncer.answer(event.payload, "lost"))

  # Θ down --------------------------------------------------------------------------------------------

  def on_params_arrived(self, event: Event) -> None:
    learner, started = self._learners[event.learner], time.perf_counter()
    kept = learner.deliver(event.payload)
    self._log.spent("deliver", time.perf_counter() - started)
    if kept and learner.status == WAITING:
      self._adopt(learner)
    elif learner.has_theta():  # adopted behind its part in flight if a second may be queued
      self.top_up(learner)

  def _adopt(self, learner: LearnerPort) -> None:
    """The learner adopts the Θ it was delivered and starts its next round."""
    delivery, started = learner.inbox, time.perf_counter()
    try:
      with annotate(f"learner{learner.index}/adopt"):
        written_off = learner.adopt(self._clock.now())
      self._budget.lose(written_off, 0.0)
    except CorruptPayload as error:  # nothing adopted: Θ goes again, whole
      self._resend_theta(learner, delivery, error)
      return
    self._syncer.adopted(learner.index)  # (a compressed Θ will not be sent again)
    self._log.adopted(time.perf_counter() - started)
    self.start_round(learner)

  def _resend_theta(self, learner: LearnerPort, delivery: Delivery, error: Exception) -> None:
    """A compressed Θ the learner could not adopt (damaged, or not for the Θ it holds) is sent again whole."""
    now = self._clock.now()
    self._log.fault("theta_resent", learner.index, now, str(error))
    if not learner.parts_in_flight():  # (else it trains on until Θ comes again)
      learner.wait(now)
    self._post.send(learner.index, self._syncer.resend(delivery))  # charged the full model's bytes

  def on_theta_pulled(self, event: Event) -> None:
    learner, m = self._learners[event.learner], event.learner
    if learner.round != event.payload or learner.parts_in_flight():
      return  # (a learner that failed meanwhile, or moved on, ignores it)
    if learner.status == WAITING:
      self.start_round(learner)
    elif learner.status == RECONFIGURING:  # it grows onto a slice given meanwhile: its round starts when that ends
      self._clock.amend(lambda e: e.learner == m and e.kind == EventKind.RECONFIGURED,
                        lambda e: Event(e.kind, m, MAIN))


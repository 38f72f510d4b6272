"""The round plan: what a learner runs next and for how long, decided in one place.

A learner's round is a main part that ends in a report, then overlap parts of τ steps that train while the report
syncs (more of them, until Θ arrives, under `outer.keep_training`); the learner adopts the Θ that answers the report
and its next round begins. `next_part` is the one rule, a pure function of what the learner is doing (`View`) and the
config: the controller dispatches by it (runtime/diloco/rounds.py), whether a part finished or a next one may be
queued behind those in flight, and the learner stages its data a part ahead by it.

How long a main part is, `rounds.length`:
- "steps": H − τ steps (H/P − τ with fragments) for every learner: each reports every H of its own steps, so
  learners of unequal speeds drift apart and the syncer merges them one at a time.
- "time": the syncs' deadlines fall every H · ξ_slowest (the slowest learner's step time: configured under the
  virtual clock, measured under the real one), on one grid for the whole run (`Deadlines`), and a main part trains
  until the first deadline at least half a period after it starts: a fast learner takes more steps, a learner that
  rejoins mid-period a shorter round, and the reports of a deadline arrive together for the grace window to gather.
The budget's last main part is what is left of it, under either. Lengths other than H − τ and τ run as several
programs of compiled lengths (`chunks`), never a compilation per length.
"""

import dataclasses
import math

from runtime.config.run import RunConfig

MAIN, OVERLAP = "main", "overlap"  # the kinds of parts
# What comes next, besides a part: adopt the Θ in its inbox (then a main part), send the budget's last report (its
# overlap work carried onto Θ), or wait (for Θ, or for its parts in flight to finish).
ADOPT, REPORT, WAIT = "adopt", "report", "wait"
RATE_DECAY = 0.8  # real clock: the moving average of a learner's measured seconds per step


@dataclasses.dataclass(frozen=True)
class Deadline:
  """Under rounds.length "time", what a main part's length is planned by: when it starts, the learner's seconds per
  step, and the deadlines' grid (origin + k · period)."""

  start: float
  seconds_per_step: float
  origin: float
  period: float

  def next(self) -> float:
    """The first deadline at least half a period after the part starts."""
    return self.origin + math.ceil((self.start + self.period / 2 - self.origin) / self.period) * self.period


@dataclasses.dataclass(frozen=True)
class View:
  """What the plan reads of a learner: the kind of its newest part ("" for a new round: no part before it in this
  round, e.g. after adopting Θ or rejoining), whether Θ waits in its inbox, whether parts are in flight, the whole
  steps of its batch left in the token budget, and the tokens it trained and has not reported."""

  newest: str
  has_theta: bool
  in_flight: bool
  steps_left: int
  unreported_tokens: int = 0
  deadline: Deadline | None = None  # rounds.length "time", a new round once step times are known; else H − τ


@dataclasses.dataclass(frozen=True)
class Next:
  """The plan's answer: an action (MAIN, OVERLAP, ADOPT, REPORT, WAIT) and, for a part, its steps."""

  action: str
  steps: int = 0


def main_steps(run: RunConfig) -> int:
  """H − τ (H/P − τ with fragments): a main part's length."""
  return run.round_steps - run.overlap_steps


def main_length(run: RunConfig, deadline: Deadline | None) -> int:
  """A main part's steps: H − τ, or under "time" as many of the learner's steps as reach the next deadline (at least
  one)."""
  if run.rounds.length == "steps" or deadline is None or deadline.period <= 0 or deadline.seconds_per_step <= 0:
    return main_steps(run)
  return max(1, round((deadline.next() - deadline.start) / deadline.seconds_per_step))


def part_lengths(run: RunConfig) -> tuple[int, ...]:
  """The part lengths a learner's programs are compiled for: H − τ, τ if any, and under "time" the powers of two
  below H − τ, which any other length is run as (`chunks`)."""
  lengths = {main_steps(run), *([run.overlap_steps] if run.overlap_steps else [])}
  if run.rounds.length == "time":
    lengths |= {1 << i for i in range(main_steps(run).bit_length()) if 1 << i < main_steps(run)}
  return tuple(sorted(lengths))


def chunks(run: RunConfig, steps: int) -> tuple[int, ...]:
  """The programs a part of `steps` runs as: itself under "steps" (where only the budget's last part has another
  length: it compiles once), else the longest compiled lengths that add up to it."""
  if run.rounds.length == "steps" or steps in part_lengths(run):
    return (steps,)
  out, lengths = [], part_lengths(run)
  while steps:
    out.append(max(n for n in lengths if n <= steps))
    steps -= out[-1]
  return tuple(out)


def next_part(run: RunConfig, view: View) -> Next:
  """What the learner runs next.

  A new round (`newest` ""): a main part of H − τ steps, or of the budget's whole steps left if fewer; with none left,
  the report of the overlap work it carried (or, having none, a one-step part the budget refuses: it finishes).
  After a main part: an overlap part of τ steps, or with τ = 0 it waits for Θ. After an overlap part: Θ adopted if it
  came, else τ more steps under `outer.keep_training`, else it waits. Behind parts still in flight, Θ is adopted (and
  the next round's main part queued) only while the budget has steps left: the budget's last report waits for the
  parts in flight.
  """
  if not view.newest:
    steps = min(main_length(run, view.deadline), view.steps_left)
    if steps < 1 and view.unreported_tokens:
      return Next(REPORT)
    return Next(MAIN, max(steps, 1))
  if view.newest == MAIN:
    return Next(OVERLAP, run.overlap_steps) if run.overlap_steps else Next(WAIT)
  if view.has_theta:
    if view.in_flight and view.steps_left < 1:
      return Next(WAIT)
    return Next(ADOPT)
  return Next(OVERLAP, run.overlap_steps) if run.outer.keep_training else Next(WAIT)


def staged_after(run: RunConfig, kind: str, has_theta: bool, deadline: Deadline | None = None) -> int:
  """The steps of the part a learner stages data for while it dispatches a part of `kind`: the overlap part that
  follows it, else a main part (after Θ is adopted, whenever that is; under "time" planned by `deadline`, a guess of
  when it starts)."""
  then = next_part(run, View(newest=kind, has_theta=has_theta, in_flight=True, steps_left=main_steps(run)))
  return then.steps if then.action == OVERLAP else main_length(run, deadline)


class Deadlines:
  """The deadlines' grid and the step times main parts are planned by, under rounds.length "time".

  Under the virtual clock the step times are the configured ones (speed × batch share × straggling, no jitter) and
  the grid is k · H · ξ_slowest from time 0: nothing to save, a resumed run plans as the one never stopped. Under the
  real clock they are measured, a moving average per learner; the period follows the slowest learner's, and the grid
  keeps its phase through the last deadline planned when the period moves.
  """

  def __init__(self, run: RunConfig, clock):
    self._run, self._clock = run, clock
    self._measured: dict[int, float] = {}  # real clock: seconds per step, a moving average per learner
    self._origin = self._period = self._last = 0.0

  def observe(self, learner: int, seconds_per_step: float) -> None:
    """A part of the learner's ended, at `seconds_per_step` (measured under the real clock)."""
    if seconds_per_step > 0:
      was = self._measured.get(learner, seconds_per_step)
      self._measured[learner] = RATE_DECAY * was + (1 - RATE_DECAY) * seconds_per_step

  def seconds_per_step(self, learner: int, scale: float = 1.0) -> float:
    """The learner's step time (`scale`: its share of its slices' work, under the virtual clock); 0 if unknown."""
    return self._clock.expected_step_seconds(learner) * scale or self._measured.get(learner, 0.0)

  def of(self, learner: int, start: float, scale: float = 1.0) -> Deadline | None:
    """What the learner's main part starting at `start` is planned by (None before any step time is known)."""
    slowest = (self._clock.slowest_step_seconds(range(self._run.learners))
               or max(self._measured.values(), default=0.0))
    xi, period = self.seconds_per_step(learner, scale), self._run.round_steps * slowest
    if period <= 0 or xi <= 0:
      return None
    if period != self._period:  # (real clock: measured again; the grid goes on from the last deadline planned)
      self._origin, self._period = self._last, period
    deadline = Deadline(start, xi, self._origin, self._period)
    self._last = max(self._last, deadline.next())
    return deadline

"""The round plan: what a learner runs next and for how long, decided in one place.

A learner's round is a main part of H − τ steps that ends in a report, then overlap parts of τ steps that train
while the report syncs (more of them, until Θ arrives, under `outer.keep_training`); the learner adopts the Θ that
answers the report and its next round begins. `next_part` is the one rule, a pure function of what the learner is
doing (`View`) and the config: the controller dispatches by it (runtime/diloco/rounds.py), whether a part finished or
a next one may be queued behind those in flight, and the learner stages its data a part ahead by it.

Under this plan every round is H steps (H/P with fragments) for every learner; only the budget's last main part is
shorter. The plan's lengths are also the part lengths a learner's programs are compiled for (`part_lengths`).
"""

import dataclasses

from runtime.config.run import RunConfig

MAIN, OVERLAP = "main", "overlap"  # the kinds of parts
# What comes next, besides a part: adopt the Θ in its inbox (then a main part), send the budget's last report (its
# overlap work carried onto Θ), or wait (for Θ, or for its parts in flight to finish).
ADOPT, REPORT, WAIT = "adopt", "report", "wait"


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


@dataclasses.dataclass(frozen=True)
class Next:
  """The plan's answer: an action (MAIN, OVERLAP, ADOPT, REPORT, WAIT) and, for a part, its steps."""

  action: str
  steps: int = 0


def main_steps(run: RunConfig) -> int:
  """H − τ (H/P − τ with fragments): a main part's length."""
  return run.round_steps - run.overlap_steps


def part_lengths(run: RunConfig) -> tuple[int, ...]:
  """The part lengths the plan dispatches (but for the budget's last main part): H − τ, and τ if any."""
  return tuple(sorted({main_steps(run), *([run.overlap_steps] if run.overlap_steps else [])}))


def next_part(run: RunConfig, view: View) -> Next:
  """What the learner runs next.

  A new round (`newest` ""): a main part of H − τ steps, or of the budget's whole steps left if fewer; with none left,
  the report of the overlap work it carried (or, having none, a one-step part the budget refuses: it finishes).
  After a main part: an overlap part of τ steps, or with τ = 0 it waits for Θ. After an overlap part: Θ adopted if it
  came, else τ more steps under `outer.keep_training`, else it waits. Behind parts still in flight, Θ is adopted (and
  the next round's main part queued) only while the budget has a main part's steps left: the budget's last report
  waits for the parts in flight.
  """
  if not view.newest:
    steps = min(main_steps(run), view.steps_left)
    if steps < 1 and view.unreported_tokens:
      return Next(REPORT)
    return Next(MAIN, max(steps, 1))
  if view.newest == MAIN:
    return Next(OVERLAP, run.overlap_steps) if run.overlap_steps else Next(WAIT)
  if view.has_theta:
    if view.in_flight and min(main_steps(run), view.steps_left) < 1:
      return Next(WAIT)
    return Next(ADOPT)
  return Next(OVERLAP, run.overlap_steps) if run.outer.keep_training else Next(WAIT)


def staged_after(run: RunConfig, kind: str, has_theta: bool) -> int:
  """The steps of the part a learner stages data for while it dispatches a part of `kind`: the overlap part that
  follows it, else a main part (after Θ is adopted, whenever that is)."""
  then = next_part(run, View(newest=kind, has_theta=has_theta, in_flight=True, steps_left=main_steps(run)))
  return then.steps if then.action == OVERLAP else main_steps(run)

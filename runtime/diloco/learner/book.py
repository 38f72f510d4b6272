"""A learner's bookkeeping: what it has trained and reported since Θ, where its data stands, its status and times.

The book is plain data, owned by the learner (runtime/diloco/learner/learner.py), which books into it what its rounds
train, report and adopt. Its fields are the learner's checkpoint JSON field for field, so saving and restoring it
goes over `dataclasses.fields` and a new field is saved without being named twice.
"""

import dataclasses
import math
from typing import Any

from runtime.diloco.learner.lifecycle import ABSENT, DONE, DOWN, FAILED, WAITING, check_move
from runtime.diloco.sync.messages import Report

# Checkpoint keys of the fields that were the Learner's private attributes before the book (`_reported_tokens`...):
# checkpoints written then keep loading, and a run resumed from one goes on bit for bit.
_KEYS = {name: f"_{name}" for name in ("unreported_busy", "reported_tokens", "reported_steps", "round_start",
                                       "reported_position", "corrupt_next", "finished_at", "state_since",
                                       "absent_seconds")}
_ROWS = ("completions", "intervals")  # lists of tuples, which JSON turns into lists of lists


@dataclasses.dataclass
class LearnerBook:
  """A learner's counters, data positions, status and times: everything of it a checkpoint saves as plain data."""

  status: str = WAITING
  tokens: int = 0  # since the last report's data ends (Θ's receipt, or the start of carried overlap work)
  steps: int = 0
  round: int = 0  # counts receipts of Θ; a report and its answer carry it
  base_version: int = 0
  total_steps: int = 0  # inner steps ever trained: drives the inner schedule and step-scheduled crashes
  busy_seconds: float = 0.0
  last_loss: float = math.nan
  reports_out: int = 0  # reports sent and not yet merged or quarantined
  unreported_busy: float = 0.0  # busy slice seconds of the parts collected since the last report
  reported_tokens: int = 0  # what of this round went into a report
  reported_steps: int = 0
  round_start: dict = dataclasses.field(default_factory=dict)  # data position when Θ was last received
  reported_position: dict = dataclasses.field(default_factory=dict)  # data position at the end of the last report
  corrupt_next: str = ""  # fault injection: corrupt the next report ("nan", "inf", "huge")
  finished_at: float = math.nan
  state_since: float = 0.0
  absent_seconds: float = 0.0  # time without a slice of lent capacity (not counted in its busy fraction)
  total_tokens: int = 0
  completions: list[tuple[float, int]] = dataclasses.field(default_factory=list)  # (time, steps) of finished parts
  intervals: list[tuple[str, float, float, str]] = dataclasses.field(default_factory=list)  # (who, from, to, status)

  # Work --------------------------------------------------------------------------------------------

  def collected(self, steps: int, tokens: int, busy: float, slices: int, loss: float, now: float,
                void: bool = False) -> None:
    """A part of `steps` inner steps finished at `now`, busy for `busy` seconds on each of its `slices`; a `void`
    part trained on what an adopted Θ replaced: its steps moved the inner schedule, its tokens were written off."""
    self.total_steps += steps
    self.busy_seconds += busy
    if not void:
      self.tokens += tokens
      self.steps += steps
      self.total_tokens += tokens
      self.unreported_busy += busy * slices  # slice time
    self.last_loss = loss
    self.completions.append((now, steps))

  def unreported_tokens(self) -> int:
    """Tokens trained since Θ that went into no report (overlap steps after it)."""
    return self.tokens - self.reported_tokens

  def sent(self, report: Report) -> None:
    """The report is on its way: its data counts as reported until the syncer answers."""
    self.reported_position, self.reported_tokens, self.reported_steps = report.data_end, report.tokens, report.steps
    self.unreported_busy = 0.0
    self.reports_out += 1

  def settled(self, report: Report, merged: bool) -> None:
    """The syncer merged or quarantined the report; a quarantined report's data is trained again."""
    self.reports_out -= 1
    if not merged and report.round == self.round:
      self.reported_position = report.data_start  # its data is trained again, even after a crash

  def new_round(self, version: int, data_position: dict, carried: bool) -> None:
    """Θ `version` was adopted with the data at `data_position`; carried overlap work (its tokens, steps, slice time
    and data) opens the new round."""
    self.round += 1
    if carried:
      self.tokens -= self.reported_tokens
      self.steps -= self.reported_steps
      self.round_start = self.reported_position
    else:
      self.tokens = self.steps = 0
      self.unreported_busy = 0.0
      self.round_start = data_position
    self.reported_tokens = self.reported_steps = 0
    self.base_version = version

  # Status and times --------------------------------------------------------------------------------

  def set_status(self, who: str, status: str, now: float) -> None:
    """Moves to `status` (a move of its lifecycle's table), closing the timeline interval (labelled `who`) of the
    previous one."""
    if status == self.status == DONE:
      return
    check_move(who, self.status, status)
    if status == DONE:  # a learner still down (or stopped) at the end stays charged with that time; one absent is not
      self.finished_at = (self.state_since if self.status == ABSENT else self.completions[-1][0]
                          if self.completions and self.status not in (DOWN, FAILED) else now)
    elif self.status == ABSENT:
      self.absent_seconds += now - self.state_since
    if now > self.state_since and self.status != DONE:
      self.intervals.append((who, self.state_since, now, self.status))
    self.status, self.state_since = status, now

  def busy_fraction(self, now: float) -> float:
    """Share of the learner's active span spent training: from the start to now, or, once it is done, to the end
    of its last inner step (the final sync of its last report is no training time to fill)."""
    span = (self.finished_at if self.status == DONE else now) - self.absent_seconds
    span -= now - self.state_since if self.status == ABSENT else 0.0
    return self.busy_seconds / span if span > 0 else 1.0

  # Checkpoint --------------------------------------------------------------------------------------

  def snapshot(self) -> dict[str, Any]:
    """The book as JSON-ready values under its checkpoint keys (the lists themselves: the caller copies them)."""
    return {_KEYS.get(f.name, f.name): getattr(self, f.name) for f in dataclasses.fields(self)}

  @classmethod
  def restored(cls, saved: dict[str, Any]) -> "LearnerBook":
    """The book `snapshot` saved (after a trip through JSON); a field its checkpoint predates keeps its default."""
    values = {f.name: saved[_KEYS.get(f.name, f.name)] for f in dataclasses.fields(cls)
              if _KEYS.get(f.name, f.name) in saved}
    values.update({name: [tuple(row) for row in values[name]] for name in _ROWS if name in values})
    return cls(**values)

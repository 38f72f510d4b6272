"""A learner's book on its own: its checkpoint round trip, the keys earlier checkpoints hold, and its bookkeeping."""

import dataclasses
import json
import math

import pytest

from runtime.diloco.learner.book import LearnerBook
from runtime.diloco.learner.lifecycle import (ABSENT, DONE, DOWN, FAILED, TRAINING, TRANSITIONS, WAITING,
                                               IllegalMove)
from runtime.diloco.sync.messages import Report

# A value for every field, each unlike its default.
CHANGED = dict(
    status=TRAINING, tokens=512, steps=3, round=4, base_version=2, total_steps=17, busy_seconds=9.5, last_loss=2.25,
    reports_out=1, unreported_busy=3.0, reported_tokens=256, reported_steps=1, round_start={"position": 5},
    reported_position={"position": 7}, corrupt_next="nan", finished_at=40.0, state_since=12.5, absent_seconds=1.5,
    total_tokens=8704, completions=[(3.0, 3), (6.0, 1)], intervals=[("learner 0", 0.0, 3.0, "training")])

# The learner's bookkeeping keys in checkpoints written before the book (its private attributes then had a "_").
KEYS_BEFORE_THE_BOOK = {
    "status", "tokens", "steps", "round", "base_version", "total_steps", "busy_seconds", "last_loss", "reports_out",
    "_unreported_busy", "_reported_tokens", "_reported_steps", "_round_start", "_reported_position", "_corrupt_next",
    "_finished_at", "_state_since", "_absent_seconds", "total_tokens", "completions", "intervals"}


def _through_json(book: LearnerBook) -> LearnerBook:
  """Saved and restored as a checkpoint does (durability.py copies the snapshot through JSON)."""
  return LearnerBook.restored(json.loads(json.dumps(book.snapshot())))


def test_every_field_changed_from_its_default_comes_back_equal_through_a_checkpoint():
  assert set(CHANGED) == {f.name for f in dataclasses.fields(LearnerBook)}  # a new field needs a value here
  default = LearnerBook()
  assert all(CHANGED[name] != getattr(default, name) for name in CHANGED)
  book = LearnerBook(**CHANGED)
  restored = _through_json(book)
  assert restored == book
  assert restored.completions[0] == (3.0, 3) and restored.intervals[0] == ("learner 0", 0.0, 3.0, "training")


def test_a_fresh_book_comes_back_with_its_defaults():
  restored = _through_json(LearnerBook())
  assert math.isnan(restored.last_loss) and math.isnan(restored.finished_at)
  assert dataclasses.replace(restored, last_loss=0.0, finished_at=0.0) == LearnerBook(last_loss=0.0, finished_at=0.0)


def test_the_checkpoint_keys_are_those_that_checkpoints_held_before_the_book():
  assert set(LearnerBook().snapshot()) == KEYS_BEFORE_THE_BOOK


def test_a_checkpoint_from_before_fragments_loads_with_no_total_tokens():
  saved = json.loads(json.dumps(LearnerBook(**CHANGED).snapshot()))
  del saved["total_tokens"]
  assert LearnerBook.restored(saved) == LearnerBook(**dict(CHANGED, total_tokens=0))


def test_a_report_settled_unmerged_serves_its_data_again_and_a_carried_round_keeps_its_overlap_work():
  book = LearnerBook(round=1)
  book.collected(steps=3, tokens=300, busy=3.0, slices=2, loss=2.0, now=3.0)
  report = Report(0, None, 300, 3, 0, 2.0, 3.0, data_start={"position": 0}, data_end={"position": 3}, round=1)
  book.sent(report)
  book.collected(steps=1, tokens=100, busy=1.0, slices=2, loss=1.5, now=4.0)
  assert (book.reports_out, book.unreported_tokens(), book.unreported_busy) == (1, 100, 2.0)
  book.settled(report, merged=False)
  assert book.reports_out == 0 and book.reported_position == {"position": 0}
  book.new_round(version=1, data_position={"position": 4}, carried=True)
  assert (book.round, book.base_version, book.tokens, book.steps) == (2, 1, 100, 1)
  assert book.round_start == {"position": 0} and book.unreported_busy == 2.0  # the overlap part's slice time stays


def test_time_absent_and_after_the_last_part_is_left_out_of_the_busy_fraction():
  book = LearnerBook(status=ABSENT)
  book.set_status("learner 0", WAITING, 10.0)  # lent a slice at t=10, and at once training
  book.set_status("learner 0", TRAINING, 10.0)
  book.collected(steps=4, tokens=400, busy=8.0, slices=1, loss=1.0, now=18.0)
  book.set_status("learner 0", WAITING, 18.0)
  book.set_status("learner 0", DONE, 30.0)  # its last report synced until t=30: no training time to fill
  assert book.busy_fraction(30.0) == pytest.approx(1.0)
  assert book.intervals == [("learner 0", 0.0, 10.0, ABSENT), ("learner 0", 10.0, 18.0, TRAINING),
                            ("learner 0", 18.0, 30.0, WAITING)]


def test_a_learner_still_down_at_the_end_stays_charged_with_that_time():
  book = LearnerBook(status=TRAINING)
  book.collected(steps=2, tokens=200, busy=2.0, slices=1, loss=1.0, now=2.0)
  book.set_status("learner 1", DOWN, 2.0)
  book.set_status("learner 1", DONE, 10.0)
  assert book.busy_fraction(10.0) == pytest.approx(0.2)


@pytest.mark.parametrize("status,to", [(FAILED, WAITING), (ABSENT, TRAINING), (DOWN, TRAINING), (DONE, TRAINING)])
def test_a_move_outside_the_lifecycles_table_is_refused_naming_both_statuses(status, to):
  book = LearnerBook(status=status)
  with pytest.raises(IllegalMove, match=f"learner 3: no move from {status} to {to}"):
    book.set_status("learner 3", to, 1.0)
  assert book.status == status and not book.intervals


def test_every_status_can_end_the_run_done_and_every_move_leads_to_a_status():
  assert all(DONE in moves or status == DONE for status, moves in TRANSITIONS.items())
  assert set().union(*TRANSITIONS.values()) <= set(TRANSITIONS)

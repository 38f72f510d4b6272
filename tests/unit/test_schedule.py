"""The one parser of the `kind:key=value,...;...` schedule language (faults.schedule, capacity.schedule)."""

import pytest

from runtime.config import capacity, schedule
from runtime.errors import ConfigError
from runtime.config import faults as plan

_KINDS = {"lend": {"slices": int, "time": float}, "note": {"text": str}}


def _parse(text, problem=lambda key, value: None):
  return schedule.parse(text, "x.schedule", _KINDS, "an item kind", "{key} of type {type}", problem)


def test_items_come_back_in_order_typed_with_their_text():
  assert _parse(" lend: slices = 2 , time=1.5 ;; note:text= hi ;") == [
      ("lend", {"slices": 2, "time": 1.5}, "lend: slices = 2 , time=1.5"), ("note", {"text": "hi"}, "note:text= hi")]
  assert _parse("") == []


@pytest.mark.parametrize("text,allowed", [
    ("borrow:slices=1", "an item kind in ('lend', 'note')"),
    ("lend:slices=1,gap=2", "lend fields ['slices', 'time']"),
    ("lend:slices=1.5", "slices of type int"),
    ("lend:slices=-1", "slices >= 0"),
])
def test_an_error_names_the_field_the_item_and_what_is_allowed(text, allowed):
  with pytest.raises(ConfigError) as err:
    _parse(text, lambda key, value: f"{key} >= 0" if value < 0 else None)
  assert err.value.field == "x.schedule" and text in str(err.value) and allowed in str(err.value)


@pytest.mark.parametrize("parse,text,allowed", [
    (plan.parse_schedule, "crash:learner=1,when=3",
     "crash fields ['ends', 'learner', 'repair', 'slice', 'step', 'time']"),
    (plan.parse_schedule, "crash:learner=x", "learner of type int"),
    (capacity.parse, "lend:slices=2,time=1,gap=3", "lend fields ['slices', 'time', 'duration']"),
    (capacity.parse, "lend:slices=x", "slices a number"),
])
def test_faults_and_capacity_keep_their_own_wording(parse, text, allowed):
  with pytest.raises(ConfigError, match=allowed.replace("[", r"\[").replace("]", r"\]")):
    parse(text)

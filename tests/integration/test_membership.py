"""Elastic membership: lent slices run new learners that join from Θ and leave when reclaimed; data never lost."""

import numpy as np
import pytest

from invariants import assert_data_accounted
from runtime.experiments import modes
from runtime.config.run import from_config_dict
from runtime.errors import ConfigError
from test_resume import assert_resumes_bit_identical


@pytest.fixture
def elastic(tiny_config):
  tiny_config.learners = 2
  tiny_config.num_devices = 5  # 2 owned slices + 3 lent at most, one device each
  tiny_config.data.batch_size = 8
  tiny_config.data.assignment = "service"
  tiny_config.total_steps = 24
  tiny_config.inner_steps, tiny_config.overlap_steps = 2, 1
  tiny_config.clock.latency_s = 0.2
  # Two slices lent from t=4 to t=12, and one more on a seeded random availability trace.
  tiny_config.capacity.schedule = "lend:slices=2,time=4,duration=8;random:slices=1,gap=3,duration=4"
  # A lent learner crashes (its own slice comes back), an owned one crashes, a corrupt report is quarantined.
  # (The random trace lends first, at t=1.7: its learner is 2, the fixed lend's are 3 and 4.)
  tiny_config.faults.schedule = "crash:learner=3,time=6,repair=1.5;crash:learner=0,time=14,repair=3;" \
                                "corrupt:learner=4,time=9,how=nan"
  tiny_config.faults.report_timeout_seconds = 3.0
  return tiny_config


@pytest.mark.slow  # CI time (~32 s on the 2-core host); `pytest -m slow` runs it
def test_lent_learners_join_from_theta_train_and_leave_and_no_window_is_lost_or_merged_twice(elastic):
  result = modes.train(elastic, None)[0]
  faults = [(f["fault"], f["learner"]) for f in result.details["faults"]]
  joins = [m for kind, m in faults if kind == "join"]
  assert {2, 3} <= set(joins) and len(joins) >= 3, faults  # the fixed lend, and the random trace's learner 4
  assert {m for kind, m in faults if kind == "leave"} >= {2, 3}
  assert ("crash", 3) in faults and ("rejoin", 3) in faults and ("quarantine", 4) in faults
  assert ("crash", 0) in faults and [f["detail"] for f in result.details["faults"] if f["fault"] == "rejoin"
                                     and f["learner"] == 0] == ["on slice 0"]  # lent slices are no spares
  merged_by = {m for r in result.records if r["kind"] == "merge" for m in r["merged"]}
  assert {0, 1, 2, 3, 4} <= merged_by  # lent learners' work reached Θ
  assert result.tokens == 24 * 8 * 32  # the whole budget, nothing lost to leaving learners
  assert_data_accounted(result, seq_len=32)
  assert 0 < result.extras["goodput"] < 1 and np.isfinite(result.final_eval_loss)


@pytest.mark.slow  # ~20 s; the scavenging experiment measures it
def test_lent_capacity_reaches_the_budget_sooner_at_equal_tokens(elastic):
  elastic.faults.schedule = ""
  elastic.num_devices, elastic.capacity.schedule = 2, ""  # one device per slice in both runs
  base = modes.train(elastic, None)[0]
  elastic.num_devices, elastic.capacity.schedule = 4, "lend:slices=2,time=2,duration=100"
  grown = modes.train(elastic, None)[0]
  assert grown.tokens == base.tokens
  # Twice the learners from t=2 on: the 24-step budget (24 s on 2 learners) takes about 2 + 22 / 2 = 13 s.
  assert grown.virtual_seconds < 0.6 * base.virtual_seconds, (grown.virtual_seconds, base.virtual_seconds)
  assert_data_accounted(grown, seq_len=32)


@pytest.mark.parametrize("faults, kills", [
    pytest.param("", (6,), marks=pytest.mark.slow),  # fault-free: ~47 s on the 2-core host (CI time)
    pytest.param(None, (5, 11), marks=pytest.mark.slow),  # with the fixture's faults; killed twice
])
def test_a_run_killed_while_learners_are_lent_resumes_bit_identical(elastic, tmp_path, monkeypatch, faults, kills):
  elastic.checkpoint_every = 1
  if faults is not None:
    elastic.faults.schedule = faults
  # Killed while the fixed lend is on, and after it, with the random trace's learner around.
  result = assert_resumes_bit_identical(elastic, tmp_path, monkeypatch, kills)
  assert_data_accounted(result, seq_len=32)


@pytest.mark.parametrize("fields, message", [
    (dict(capacity=dict(schedule="lend:slices=2,time=4,duration=8")), "data.assignment='service'"),
    (dict(capacity=dict(schedule="lend:slices=2,time=4")), "every lend field"),
    (dict(capacity=dict(schedule="borrow:slices=2")), "an item kind in"),
    (dict(capacity=dict(schedule="lend:slices=0,time=4,duration=8")), "slices >= 1"),
    (dict(data=dict(assignment="global")), "one of ('shards', 'service')"),
    (dict(mode="dp", data=dict(assignment="service")), "'shards' in mode 'dp'"),
])
def test_bad_capacity_settings_name_the_field(tiny_config, fields, message):
  for key, value in fields.items():
    if isinstance(value, dict):
      for k, v in value.items():
        tiny_config[key][k] = v
    else:
      tiny_config[key] = value
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    from_config_dict(tiny_config)


def test_a_lent_learner_joins_where_the_run_stands_in_the_inner_schedule(tiny_config):
  """Its warmup does not restart: its first merge applies the owned learner's learning rate, not the warmup's 0."""
  tiny_config.learners, tiny_config.num_devices, tiny_config.data.batch_size = 1, 2, 4
  tiny_config.data.assignment, tiny_config.total_steps = "service", 8
  tiny_config.inner_steps, tiny_config.overlap_steps = 2, 1
  tiny_config.capacity.schedule = "lend:slices=1,time=2,duration=100"
  result = modes.train(tiny_config, None)[0]
  assert [(f["fault"], f["learner"]) for f in result.details["faults"]] == [("join", 1)]
  first = next(r for r in result.records if r["kind"] == "merge" and 1 in r["merged"])
  lr = dict(zip(first["merged"], first["lr"]))
  assert 0 in lr and lr[1] == lr[0] > 0, first


def test_a_part_cut_off_by_a_reclaim_is_not_booked_as_trained(tiny_config):
  """A lent slice reclaimed while its learner's part runs (modeled): the part is dropped, not booked as finished at
  the reclaim (its busy time above the time the learner was present: a busy fraction above 1), with an injector
  armed (a fault scheduled) as without one."""
  tiny_config.learners, tiny_config.num_devices, tiny_config.data.batch_size = 1, 2, 4
  tiny_config.data.assignment, tiny_config.total_steps = "service", 8
  tiny_config.inner_steps, tiny_config.overlap_steps = 2, 1
  tiny_config.capacity.schedule = "lend:slices=1,time=2,duration=1.5"  # reclaimed at 3.5, amid a 1 s step
  faults = ("", "corrupt:learner=0,time=5,how=nan")
  runs = []
  for schedule in faults:
    tiny_config.faults.schedule = schedule
    result = modes.train(tiny_config, None)[0]
    leave = next(f for f in result.details["faults"] if f["fault"] == "leave")
    assert leave["learner"] == 1 and leave["time"] == 3.5, leave
    busy = [r["busy"][1] for r in result.records if r["kind"] == "merge"]
    assert busy and all(0.0 <= b <= 1.0 for b in busy), busy
    runs.append(result)
  assert runs[0].tokens == runs[1].tokens

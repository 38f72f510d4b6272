"""The scavenging experiment's variants and its time-to-loss measure (the runs themselves: launch.scavenging)."""

import math

from runtime.experiments import scavenging
from runtime.config.run import from_config_dict, with_fields
from runtime.train.harness import RunResult


def test_each_variant_is_a_valid_run_at_equal_tokens_with_one_device_per_slice(tiny_config):
  tiny_config.data.assignment = "service"
  tiny_config.learners, tiny_config.num_devices = 2, 2
  base = from_config_dict(tiny_config)
  variants = scavenging.variants(base, [4, 8], lend_at=3.0, lend_seconds=5.0)
  assert list(variants) == ["M=2", "M=2→4", "M=2→4, run schedule", "M=4 throughout", "M=2→8", "M=2→8, run schedule",
                            "M=8 throughout"]
  for name, fields in variants.items():
    run = with_fields(base, fields)
    assert run.token_budget == base.token_budget, name
    assert run.num_devices == run.num_slices + run.lent_slices, name
    assert run.learner_batch(0) == base.learner_batch(0), name
  grown = with_fields(base, variants["M=2→8"])
  assert grown.lent_slices == 6 and grown.capacity.schedule[0].time == 3.0
  assert with_fields(base, variants["M=2→8, run schedule"]).inner.schedule_progress == "run"


def test_time_to_loss_is_the_first_eval_at_or_below_the_target():
  records = [dict(kind="eval", time=t, eval_loss=l) for t, l in ((10, 3.0), (20, 2.5), (30, 2.6), (40, 2.4))]
  result = RunResult("r", "decoupled", 0, 2.4, 0.0, 40.0, 0.0, records=records + [dict(kind="merge", time=5)])
  assert scavenging.time_to_loss(result, 2.55) == 20
  assert scavenging.time_to_loss(result, 2.4) == 40
  assert math.isnan(scavenging.time_to_loss(result, 2.0))

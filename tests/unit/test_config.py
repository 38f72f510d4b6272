"""Bad configs fail at the boundary with an error naming the field and the allowed values."""

import pytest

from configs import chaos, default, diloco_sync, dp, quality, smoke
from runtime.config.run import from_config_dict
from runtime.errors import ConfigError


def _with(path: str, value):
  config = default.get_config()
  node = config
  *parents, leaf = path.split(".")
  for p in parents:
    node = node[p]
  with node.ignore_type():  # as a config file could set it; ConfigDict's own type check is not the boundary
    node[leaf] = value
  return config


@pytest.mark.parametrize("path,value,names", [
    ("inner.lr", -1e-3, "inner.lr"),
    ("model.size", "gigantic", "model.size"),
    ("data.batch_size", 30, "data.batch_size"),
    ("outer.quorum", 9, "outer.quorum"),
    ("outer.merge", "median", "outer.merge"),
    ("mode", "pipeline", "mode"),
    ("clock.kind", "sundial", "clock.kind"),
    ("clock.speeds", (1.0, 2.0), "clock.speeds"),
    ("num_devices", 6, "num_devices"),
    ("overlap_steps", 30, "overlap_steps"),
    ("data.seq_len", 4096, "data.seq_len"),
    ("model.num_heads", 5, "model.num_heads"),
    ("tokens_per_param", -20.0, "tokens_per_param"),
    ("eval_batch_size", -1, "eval_batch_size"),
])
def test_invalid_value_names_its_field_and_what_is_allowed(path, value, names):
  with pytest.raises(ConfigError) as err:
    from_config_dict(_with(path, value))
  assert err.value.field == names
  assert f"'{names}'" in str(err.value) and "allowed" in str(err.value)


def test_unknown_field_lists_the_known_ones():
  config = default.get_config()
  config.outer.lerning_rate = 0.5
  with pytest.raises(ConfigError, match="outer.lerning_rate.*one of the fields.*'lr'"):
    from_config_dict(config)


@pytest.mark.parametrize("module", [default, smoke, dp, diloco_sync, chaos, quality])
def test_every_shipped_training_config_validates(module):
  from_config_dict(module.get_config())


def test_size_presets_apply():
  run = from_config_dict(smoke.get_config())
  assert run.model.d_model == 64 and run.model.num_layers == 2
  run = from_config_dict(default.get_config())
  assert run.learners == 4 and run.num_devices == 8 and run.mode == "decoupled"


def test_synchronous_diloco_mode_forces_quorum_to_all_learners():
  run = from_config_dict(_with("mode", "diloco_sync"))
  assert run.outer.quorum == run.learners and run.outer.grace == "none"


@pytest.mark.parametrize("mode", ["decoupled", "dp", "dp_elastic"])
@pytest.mark.parametrize("schedule,allowed", [
    ("crash:learner=1", "exactly one of time"),
    ("crash:time=10", "a learner=M field"),
    ("quake:learner=0,time=1", "a fault kind"),
    ("link:learner=0,time=1,mode=sideways", "mode in"),
    ("crash:learner=7,time=3", "learner in [0, 4)"),
])
def test_a_bad_fault_schedule_fails_at_the_boundary_in_every_mode(mode, schedule, allowed):
  config = _with("faults.schedule", schedule)
  config.mode = mode
  with pytest.raises(ConfigError) as err:
    from_config_dict(config)
  assert err.value.field == "faults.schedule" and allowed in str(err.value)


def test_the_fault_schedule_is_parsed_once_into_typed_faults():
  run = from_config_dict(_with("faults.schedule", "crash:learner=1,time=30; straggler:learner=2,time=5,"
                                                  "duration=9,factor=3"))
  crash, straggler = run.faults.schedule
  assert (crash.kind, crash.learner, crash.time, crash.step) == ("crash", 1, 30.0, -1)
  assert (straggler.kind, straggler.duration, straggler.factor) == ("straggler", 9.0, 3.0)


def test_a_field_that_moved_section_names_its_new_place():
  config = default.get_config()
  config.faults.quarantine_factor = 50.0
  with pytest.raises(ConfigError, match="new name 'outer.quarantine_factor'"):
    from_config_dict(config)


@pytest.mark.parametrize("mtbi,schedule", [
    (0.0, "crash:learner=1,step=6;corrupt:learner=0,time=5,how=nan;link:learner=2,time=1,duration=3"),
    (1e6, ""),  # random crashes, armed in the running program when they fall (wall seconds)
    (0.0, "crash:learner=1,time=10;straggler:learner=0,time=5,duration=10,factor=3"),
])
def test_every_fault_is_accepted_under_the_real_clock(mtbi, schedule):
  config = _with("clock.kind", "real")
  config.faults.mtbi_chip_seconds, config.faults.schedule = mtbi, schedule
  assert len(from_config_dict(config).faults.schedule) == len([f for f in schedule.split(";") if f])


def test_a_trace_time_scale_must_be_positive():
  config = _with("faults.time_scale", 0.0)
  with pytest.raises(ConfigError, match="faults.time_scale"):
    from_config_dict(config)


def test_unequal_learner_batches_need_only_sum_to_the_global_batch():
  config = _with("learners", 3)
  config.num_devices = 3
  config.data.batch_size = 10
  config.data.learner_batches = (4, 4, 2)
  run = from_config_dict(config)
  assert [run.learner_batch(m) for m in range(3)] == [4, 4, 2]
  config.data.learner_batches = (4, 4, 3)
  with pytest.raises(ConfigError, match="summing to data.batch_size"):
    from_config_dict(config)


@pytest.mark.parametrize("path,value,names,allowed", [
    ("outer.lr", float("inf"), "outer.lr", "a finite number"),
    ("clock.step_seconds", float("inf"), "clock.step_seconds", "a finite number"),
    ("inner.lr", float("nan"), "inner.lr", "a finite number"),
    ("seed", -1, "seed", "[0, 2**32)"),
    ("learners", "4", "learners", "an integer"),
    ("outer.nesterov", "yes", "outer.nesterov", "True or False"),
    ("learners", 1000, "learners", "num_devices (8)"),
    ("slices", 100, "slices", "num_devices (8)"),
    ("clock.speeds", ("(1,nan,1,1)",), "clock.speeds", "finite numbers"),
    ("clock.speeds", ("(1,x,1,1)",), "clock.speeds", "a tuple of floats"),
    ("data.learner_batches", (8, 8, 8, 8.5), "data.learner_batches", "a tuple of ints"),
    ("faults.schedule", "crash:learner=1,time=nan", "faults.schedule", "time a finite number"),
    ("faults.schedule", "straggler:learner=1,time=3,duration=-2", "faults.schedule", "duration >= 0"),
])
def test_values_a_user_can_type_that_are_not_allowed(path, value, names, allowed):
  with pytest.raises(ConfigError) as err:
    from_config_dict(_with(path, value))
  assert err.value.field == names
  assert allowed in str(err.value)


def test_tuple_fields_given_as_text_are_parsed_as_their_element_type():
  run = from_config_dict(_with("clock.speeds", ("(1, 1.5,1,2)",)))
  assert run.clock.speeds == (1.0, 1.5, 1.0, 2.0)
  run = from_config_dict(_with("data.learner_batches", ("8,8,8,8",)))
  assert run.data.learner_batches == (8, 8, 8, 8)


def test_every_model_field_is_settable_and_unset_ones_come_from_the_size_preset():
  run = from_config_dict(_with("model.num_layers", 3))
  assert (run.model.num_layers, run.model.d_model) == (3, 128)  # "small" gives d_model 128
  assert from_config_dict(default.get_config()).model.num_layers == 2


def test_a_misspelled_field_gets_a_suggestion():
  config = default.get_config()
  with config.outer.unlocked():
    config.outer.quorom = 2
  with pytest.raises(ConfigError, match="did you mean 'outer.quorum'"):
    from_config_dict(config)


def test_more_fragments_than_the_model_has_tensors_is_refused_naming_both_numbers():
  config = default.fixed_rounds(default.get_config())  # fragments sync on rounds of H steps
  config.inner_steps = 30
  config.fragments = 30
  with pytest.raises(ConfigError, match=r"'fragments' = 30 .*at most the model's 27 parameter tensors"):
    from_config_dict(config)
  config.fragments = 15
  from_config_dict(config)


@pytest.mark.parametrize("layers,positions,qk_norm", [(1, "rotary", False), (2, "rotary", True),
                                                      (3, "learned", False), (2, "learned", True)])
def test_the_models_tensor_and_parameter_counts_are_those_of_its_parameter_tree(layers, positions, qk_norm):
  import dataclasses  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from models import lm  # pylint: disable=g-import-not-at-top
  from models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  cfg = dataclasses.replace(ModelConfig(), num_layers=layers, positions=positions, qk_norm=qk_norm, d_model=96,
                            num_heads=4, mlp_dim=160)
  abstract = lm.abstract_params(cfg)
  assert cfg.num_tensors() == len(jax.tree.leaves(abstract))
  assert cfg.num_params() == sum(x.size for x in jax.tree.leaves(abstract))
  llama = dataclasses.replace(cfg, kind="llama", positions="rotary", num_kv_heads=2, tied_embeddings=layers != 2)
  abstract = lm.abstract_params(llama)
  assert llama.num_tensors() == len(jax.tree.leaves(abstract))
  assert llama.num_params() == sum(x.size for x in jax.tree.leaves(abstract))


def test_a_budget_in_tokens_per_parameter_sets_the_steps_from_the_model_and_the_global_batch():
  config = default.get_config()
  config.tokens_per_param = 20.0
  run = from_config_dict(config)
  assert run.model.num_params() == 428_544  # the default ("small") model
  assert run.total_steps == 30 * round(20 * 428_544 / (32 * 128 * 30)) == 2100  # whole rounds of H = 30
  config.model.size = "tiny"
  config.data.batch_size = 8
  config.inner_steps = 10
  assert from_config_dict(config).total_steps == 10 * round(20 * 115_968 / (8 * 128 * 10)) == 2260
  config.tokens_per_param = 0.0  # off: total_steps decides
  assert from_config_dict(config).total_steps == 300


@pytest.mark.parametrize("path,value", [("inner_steps", 0), ("tokens_per_param", float("nan")), ("model.num_heads", 0),
                                        ("data.batch_size", 0)])
def test_a_budget_in_tokens_per_parameter_leaves_a_bad_field_to_the_validator(path, value):
  # Regression: the budget was computed before validation: ZeroDivisionError and ValueError tracebacks.
  config = _with(path, value)
  if path != "tokens_per_param":
    config.tokens_per_param = 20.0
  with pytest.raises(ConfigError) as err:
    from_config_dict(config)
  assert path in str(err.value)


def test_the_held_out_batch_is_a_learners_share_unless_set_and_then_the_same_for_every_m():
  config = default.get_config()
  assert from_config_dict(config).eval_batch == 32 // 4
  config.eval_batch_size = 16
  assert from_config_dict(config).eval_batch == 16
  config.learners = 2
  assert from_config_dict(config).eval_batch == 16


def test_every_invalid_field_is_reported_at_once():
  config = default.get_config()
  config.learners = 3  # neither the global batch of 32 nor the 8 devices split three ways
  config.inner.lr = -1.0
  with pytest.raises(ConfigError) as err:
    from_config_dict(config)
  assert [e.field for e in err.value.errors] == ["data.batch_size", "num_devices", "inner.lr"]
  assert str(err.value).startswith("3 config fields are invalid:") and str(err.value).count("allowed") == 3
  config = default.get_config()
  config.model.num_heads = 0  # a zero no later check divides by
  config.outer.lr = 0.0
  with pytest.raises(ConfigError) as err:
    from_config_dict(config)
  assert [e.field for e in err.value.errors] == ["model.num_heads", "outer.lr"]

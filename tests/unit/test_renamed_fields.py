"""A renamed config field is refused under its old name, with the new one, rather than silently ignored."""

import pytest

from configs import default
from runtime import cli
from runtime.config.run import from_config_dict
from runtime.errors import ConfigError, UsageError


def test_the_old_name_of_dp_restarts_checkpoint_interval_names_the_new_one():
  config = default.get_config()
  config.faults.checkpoint_every = 5
  with pytest.raises(ConfigError, match="new name 'faults.restart_checkpoint_every'") as err:
    from_config_dict(config)
  assert err.value.field == "faults.checkpoint_every"


def test_the_old_name_on_the_command_line_suggests_the_new_one():
  with pytest.raises(UsageError, match="did you mean 'faults.restart_checkpoint_every'"):
    cli.check_overrides(["--config.faults.checkpoint_every=5"], default.get_config())


def test_the_new_name_sets_the_interval_and_the_runs_own_checkpoint_every_stays_apart():
  config = default.get_config()
  config.mode, config.faults.restart_checkpoint_every = "dp_restart", 7
  run = from_config_dict(config)
  assert (run.faults.restart_checkpoint_every, run.checkpoint_every) == (7, 0)


def test_the_old_outer_momentum_per_names_outer_rule_and_how_its_values_read():
  config = default.get_config()
  config.outer.momentum_per = "round"
  with pytest.raises(ConfigError, match="new name 'outer.rule' .*'round' is 'momentum_per_round'") as err:
    from_config_dict(config)
  assert err.value.field == "outer.momentum_per" and "\n" not in str(err.value)

"""The heterogeneity experiment's variants: each is the base config with its mechanism changed, validated."""

import pytest

from configs import heterogeneity as heterogeneity_config
from runtime.experiments import heterogeneity
from runtime.config.run import from_config_dict
from runtime.errors import UsageError


def test_every_variant_changes_only_its_fields_and_the_seed():
  base = from_config_dict(heterogeneity_config.get_config())
  sync = heterogeneity.variant_config(base, "K=M", seed=2)
  assert (sync.outer.quorum, sync.outer.grace, sync.seed) == (8, "none", 2)
  grace = heterogeneity.variant_config(base, "K=1+grace", seed=0)
  assert (grace.outer.quorum, grace.outer.grace, grace.outer.receive) == (1, "adaptive", "carry")
  assert heterogeneity.variant_config(base, "K=1+grace -carry", 0).outer.receive == "overwrite"
  assert heterogeneity.variant_config(base, "K=1+grace -overlap", 0).overlap_steps == 0
  assert heterogeneity.variant_config(base, "K=1+grace -weighting", 0).outer.token_weighting is False
  assert base.clock.speeds == (1.0,) * 4 + (1.18,) * 4 and base.clock.jitter == 0.1


def test_an_unknown_variant_names_the_flag_and_the_choices():
  with pytest.raises(UsageError, match="--variants.*K=1\\+grace"):
    heterogeneity.run(heterogeneity_config.get_config(), None, seeds=[0], variants=["K=2"])

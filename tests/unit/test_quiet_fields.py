"""Fields that change nothing a run computes: one list, read by the run's name and by resume's config check."""

import dataclasses

import pytest

from configs import smoke
from runtime import cli
from runtime.config.run import QUIET_FIELDS, RunConfig, from_config_dict
from runtime.errors import UsageError
from runtime.reporting import provenance

_CHANGED = {"progress": False, "tensorboard": False, "compile_cache": "", "backend": "pathways", "checkpoint_every": 7,
            "checkpoint_seconds": 30.0, "checkpoint_wall_seconds": 60.0, "checkpoint_keep": 9,
            "checkpoint_learner_state": False, "resume": True,
            "save_model_every": 3, "ray.address": "auto", "ray.hang_seconds": 30.0, "ray.hang_factor": 4.0,
            "ray.processes_per_learner": 2, "host_transfers": "pinned"}


def _changed(run: RunConfig, changes: dict) -> RunConfig:
  """`run` with each field changed, a dotted one ("section.field") in its section."""
  for key, value in changes.items():
    section, _, name = key.rpartition(".")
    run = (dataclasses.replace(run, **{section: dataclasses.replace(getattr(run, section), **{name: value})})
           if section else dataclasses.replace(run, **{name: value}))
  return run


def test_every_quiet_field_is_a_run_config_field_and_changed_below():
  for key in QUIET_FIELDS:
    section, _, name = key.rpartition(".")
    fields = dataclasses.fields(type(getattr(RunConfig(), section)) if section else RunConfig)
    assert name in {f.name for f in fields}, key
  assert set(_CHANGED) == set(QUIET_FIELDS)


def test_a_quiet_field_is_not_part_of_a_runs_name():
  assert cli.varied({**_CHANGED, "outer.quorum": 2}) == "outer.quorum=2"


def test_a_run_resumes_whatever_its_quiet_fields_are_now(tmp_path):
  run = dataclasses.replace(from_config_dict(smoke.get_config()), checkpoint_every=2)  # a run that can resume
  provenance.write(run, tmp_path / "decoupled", "decoupled")
  name, lock = provenance.claim(tmp_path, "decoupled", _changed(run, _CHANGED), resumable=True)
  assert name == "decoupled"
  lock.release()
  with pytest.raises(UsageError, match="inner_steps: 10 there, 11 now"):
    provenance.claim(tmp_path, "decoupled", dataclasses.replace(run, inner_steps=11), resumable=True)

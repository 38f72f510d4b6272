"""Sweeps: the grid and list specs, per-point configs, and a real 2 × 2 sweep that resumes."""

import json

import pytest

from configs import smoke
from runtime.experiments import sweep
from runtime.config.run import from_config_dict
from runtime.errors import ConfigError, UsageError
from launcher import FAST, launch


def test_a_grid_runs_every_combination_in_order_and_a_list_pairs_by_position():
  grid = sweep.parse("outer.quorum=1,2;inner_steps=10,30")
  assert [p.fields for p in grid] == [
      (("outer.quorum", "1"), ("inner_steps", "10")), (("outer.quorum", "1"), ("inner_steps", "30")),
      (("outer.quorum", "2"), ("inner_steps", "10")), (("outer.quorum", "2"), ("inner_steps", "30"))]
  assert [p.name for p in sweep.parse("outer.quorum=1,2;inner_steps=10,30", "list")] == [
      "outer.quorum=1,inner_steps=10", "outer.quorum=2,inner_steps=30"]


def test_values_in_brackets_or_quotes_keep_their_commas():
  points = sweep.parse("clock.speeds=(1,1,1,2),(1,1,1,1);faults.schedule='crash:learner=1,time=5',''")
  assert [dict(p.fields)["clock.speeds"] for p in points][::2] == ["(1,1,1,2)", "(1,1,1,1)"]
  assert dict(points[0].fields)["faults.schedule"] == "'crash:learner=1,time=5'"
  config = sweep.point_config(smoke.get_config(), points[0])
  run = from_config_dict(config)
  assert run.clock.speeds == (1.0, 1.0, 1.0, 2.0) and run.faults.schedule[0].time == 5.0


@pytest.mark.parametrize("spec,kind,message", [
    ("", "grid", "no field"),
    ("outer.quorum", "grid", "not a field and its values"),
    ("outer.quorum=", "grid", "not a field and its values"),
    ("outer.quorum=1;outer.quorum=2", "grid", "swept twice"),
    ("outer.quorum=1,2;inner_steps=5", "list", "as many values"),
    ("outer.quorum=1", "zip", "--sweep_kind"),
])
def test_a_bad_spec_names_the_flag(spec, kind, message):
  with pytest.raises(UsageError, match=message):
    sweep.parse(spec, kind)


def test_point_values_take_the_fields_types_and_bad_ones_name_the_field():
  config = smoke.get_config()
  point = sweep.parse("outer.lr=0.5;outer.nesterov=false;data.max_bytes=1000;learners=2")[0]
  run = from_config_dict(sweep.point_config(config, point))
  assert (run.outer.lr, run.outer.nesterov, run.data.max_bytes, run.learners) == (0.5, False, 1000, 2)
  assert config.outer.lr == 0.7  # the base config is not changed
  with pytest.raises(ConfigError, match="outer.quorum"):
    sweep.point_config(config, sweep.parse("outer.quorum=two")[0])
  with pytest.raises(UsageError, match="did you mean 'outer.quorum'"):
    sweep.point_config(config, sweep.parse("outer.quorom=1")[0])


@pytest.mark.slow  # ~20 s of subprocesses
def test_a_two_by_two_sweep_writes_one_table_and_plot_and_a_second_invocation_skips_finished_points(tmp_path):
  args = ["--config=smoke", "--sweep=outer.quorum=1,2;outer.lr=0.5,0.7", f"--workdir={tmp_path}", "--parallel=2",
          *FAST]
  first = launch("sweep", *args, cwd=tmp_path)
  assert first.returncode == 0, first.stderr[-3000:] + first.stdout[-3000:]
  table = (tmp_path / "sweep.txt").read_text().splitlines()
  assert table[0] == "sweep over outer.quorum × outer.lr: 4 points"
  assert table[1].split()[:3] == ["outer.quorum", "outer.lr", "status"] and "eval_loss" in table[1]
  assert [line.split()[:3] for line in table[3:]] == [
      ["1", "0.5", "done"], ["1", "0.7", "done"], ["2", "0.5", "done"], ["2", "0.7", "done"]]
  assert (tmp_path / "sweep.png").stat().st_size > 10_000 and "outer.quorum" in (tmp_path / "sweep.md").read_text()
  for point in ("outer.quorum=1,outer.lr=0.5", "outer.quorum=2,outer.lr=0.7"):
    run_json = next((tmp_path / point).glob("*/run.json"))
    config = json.loads(run_json.read_text())["config"]
    assert (config["outer"]["quorum"], config["learners"]) == (int(point[13]), 2)
  # The outer learning rate changes what is learned: the points are really different runs.
  losses = {line.split()[1]: float(line.split()[4]) for line in table[3:5]}
  assert losses["0.5"] != losses["0.7"]

  stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/results.json")}
  second = launch("sweep", *args, cwd=tmp_path)
  assert second.returncode == 0, second.stderr[-3000:]
  assert second.stdout.count("finished earlier, skipped") == 4 and "done in" not in second.stdout
  assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/results.json")} == stamps
  # The same workdir with another base config is refused, not mixed in.
  third = launch("sweep", *args, "--config.seed=1", cwd=tmp_path)
  assert third.returncode == 2 and "--workdir" in third.stderr


def test_a_damaged_sweep_record_is_one_line_naming_it(tmp_path):
  (tmp_path / "sweep.json").write_text('{"config": "smo')
  with pytest.raises(UsageError, match=r"sweep.json is damaged .*restore it, or write"):
    sweep.record(tmp_path / "sweep.json", "configs/smoke.py", [])


def test_a_point_without_checkpoints_starts_over_when_rerun_one_with_checkpoints_resumes():
  config = smoke.get_config()
  fields = (("outer.quorum", "2"),)
  assert sweep.restartable(fields, config) == (*fields, ("resume", "False"))  # an interrupted one cannot resume
  config.checkpoint_every = 2
  assert sweep.restartable(fields, config) == fields

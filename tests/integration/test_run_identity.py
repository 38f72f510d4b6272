"""A run is found again by its name: moved data resumes, a changed training is refused, damaged records are repaired
or named, and a workdir's summary lists every run in it."""

import dataclasses
import json
import pathlib
import shutil

import pytest

from configs import smoke
from launcher import FAST, launch
from runtime.config.run import from_config_dict
from runtime.errors import DataError, UsageError
from runtime.experiments import modes
from runtime.reporting import metrics, provenance
from test_checkpoint import _kill_after_first_checkpoint


def _recorded(tmp_path, run, name="decoupled", finished=False):
  """A run directory as a run of `run` leaves it (its run.json; its result if it ended)."""
  provenance.write(run, tmp_path / name, name)
  if finished:
    (tmp_path / name / provenance.RESULT_JSON).write_text("{}")
  return tmp_path / name


def _checkpointed(config):
  """`config` resolved with checkpoints on: a run that can resume."""
  config.checkpoint_every = 2
  return from_config_dict(config)


def _claim(tmp_path, run, resumable=True, name="decoupled"):
  claimed, lock = provenance.claim(tmp_path, name, run, resumable=resumable)
  lock.release()
  return claimed


def test_a_dataset_moved_with_its_content_resumes_and_says_so(tmp_path, prepared_dataset, capsys):
  data = shutil.copytree(prepared_dataset, tmp_path / "data")
  config = smoke.get_config()
  config.data.path = str(data)
  run = _checkpointed(config)
  _recorded(tmp_path / "work", run)
  moved = data.rename(tmp_path / "moved")
  assert _claim(tmp_path / "work", dataclasses.replace(run, data=dataclasses.replace(run.data, path=str(moved)))) \
      == "decoupled"
  assert f"the dataset moved: data.path '{data}' -> '{moved}' holds the same data" in capsys.readouterr().out


def test_other_data_under_a_new_path_or_another_model_is_refused_naming_each_field(tmp_path):
  run = from_config_dict(smoke.get_config())
  _recorded(tmp_path, run)
  other = tmp_path / "other.txt"
  other.write_text("not the standard library\n" * 100)
  with pytest.raises(UsageError, match=rf"data.path: 'stdlib' there, '{other}' now \(other data\)"):
    _claim(tmp_path, dataclasses.replace(run, data=dataclasses.replace(run.data, path=str(other))))
  with pytest.raises(UsageError) as error:
    _claim(tmp_path, dataclasses.replace(run, model=dataclasses.replace(run.model, d_model=32, mlp_dim=128)))
  assert "model.d_model: 64 there, 32 now; model.mlp_dim: 256 there, 128 now" in str(error.value)
  assert "--run_name" in str(error.value) and "\n" not in str(error.value)


def test_the_evaluation_cadence_may_change_and_is_said_quiet_fields_are_not(tmp_path, capsys):
  run = _checkpointed(smoke.get_config())
  _recorded(tmp_path, run)
  assert _claim(tmp_path, dataclasses.replace(run, eval_every=5, progress=False)) == "decoupled"
  out = capsys.readouterr().out
  assert "eval_every is now 5 (was 20)" in out and "progress" not in out


def test_an_unfinished_run_that_cannot_resume_is_never_started_afresh_unless_asked(tmp_path, capsys):
  run = dataclasses.replace(from_config_dict(smoke.get_config()), checkpoint_wall_seconds=0.0)  # (on by default)
  _recorded(tmp_path, run)
  with pytest.raises(UsageError, match="'decoupled' there is unfinished and was not checkpointed"):
    _claim(tmp_path, run, resumable=False)
  # Regression: checkpoints turned on now made the run look resumable; it started over in its own directory.
  with pytest.raises(UsageError, match="'decoupled' there is unfinished and was not checkpointed"):
    _claim(tmp_path, dataclasses.replace(run, checkpoint_every=2), resumable=True)
  assert _claim(tmp_path, dataclasses.replace(run, resume=False), resumable=False) == "decoupled.2"
  _recorded(tmp_path, run, name="finished", finished=True)
  assert _claim(tmp_path, run, resumable=False, name="finished") == "finished.2"
  assert "it is finished and mode 'decoupled' without checkpoints cannot resume" in capsys.readouterr().out


def test_data_changed_in_place_is_refused(tmp_path):
  # Regression: the data's digest was compared only when data.path changed.
  text = tmp_path / "corpus.txt"
  text.write_text("def f():\n  return 1\n" * 400)
  config = smoke.get_config()
  config.data.path = str(text)
  run = _checkpointed(config)
  _recorded(tmp_path / "work", run)
  assert _claim(tmp_path / "work", run) == "decoupled"
  text.write_text("class C:\n  pass\n" * 400)
  with pytest.raises(UsageError, match=rf"data.path: the data at '{text}' changed since the run began"):
    _claim(tmp_path / "work", run)


def test_an_unfinished_run_named_the_old_way_is_pointed_out(tmp_path, capsys):
  run = from_config_dict(smoke.get_config())
  _recorded(tmp_path, run, name="decoupled,outer.quorum=2")
  assert _claim(tmp_path, run) == "decoupled"
  assert f"{tmp_path / 'decoupled,outer.quorum=2'} holds an unfinished run named the old way" in capsys.readouterr().out


def test_a_damaged_run_json_stops_with_one_line_naming_it(tmp_path):
  run = from_config_dict(smoke.get_config())
  run_dir = _recorded(tmp_path, run)
  (run_dir / "run.json").write_text('{"name": "decoupled", "config": {"mo')  # torn
  with pytest.raises(UsageError, match=rf"{run_dir / 'run.json'} is damaged .*move {run_dir} aside"):
    _claim(tmp_path, run)


def test_run_json_is_written_whole_or_not_at_all_and_a_killed_writers_temporary_file_is_cleared(tmp_path,
                                                                                                monkeypatch):
  run = _checkpointed(smoke.get_config())
  (tmp_path / "decoupled").mkdir()
  (tmp_path / "decoupled" / ".run.123.tmp.json").write_text('{"na')  # a process killed while writing run.json
  assert _claim(tmp_path, run) == "decoupled"  # the directory holds nothing else: this run's own
  assert not (tmp_path / "decoupled" / ".run.123.tmp.json").exists()
  _recorded(tmp_path, run)
  before = (tmp_path / "decoupled" / "run.json").read_text()
  write_text = pathlib.Path.write_text

  def torn(path, text, *args, **kwargs):
    write_text(path, text[:len(text) // 2], *args, **kwargs)
    raise OSError("killed mid-write")

  monkeypatch.setattr(pathlib.Path, "write_text", torn)
  with pytest.raises(OSError, match="killed mid-write"):
    provenance.write(run, tmp_path / "decoupled", "decoupled")
  monkeypatch.undo()
  assert (tmp_path / "decoupled" / "run.json").read_text() == before


def test_a_torn_last_record_is_left_out_and_repaired_a_damaged_middle_one_is_named(tmp_path, capsys):
  path = tmp_path / "run" / "metrics.jsonl"
  path.parent.mkdir()
  path.write_text('{"kind": "merge", "tokens": 10}\n{"kind": "merge", "tokens": 20}\n{"kind": "eval", "tok')
  records, torn = metrics.read_records(path)
  assert [r["tokens"] for r in records] == [10, 20] and "its last line (3) was cut short" in torn
  with metrics.MetricsLogger(tmp_path, run="run", progress=False, tensorboard=False, resume_after=20) as logger:
    assert [r["tokens"] for r in logger.records] == [10, 20]
  assert "left out, and the file repaired" in capsys.readouterr().err
  assert [r["tokens"] for r in metrics.read_jsonl(path)] == [10, 20] and metrics.read_records(path)[1] == ""
  path.write_text('{"kind": "merge", "tokens": 10}\nnot json\n{"kind": "merge", "tokens": 20}\n')
  with pytest.raises(DataError, match=r"metrics.jsonl: line 2 is not a record .*move it aside"):
    metrics.MetricsLogger(tmp_path, run="run", progress=False, tensorboard=False, resume_after=20)


def test_a_workdirs_summary_lists_every_run_in_it(tiny_config, tmp_path, capsys):
  modes.train(tiny_config, tmp_path, name="first")
  tiny_config.outer.quorum = 2
  modes.train(tiny_config, tmp_path, name="second")
  rows = json.loads((tmp_path / "results.json").read_text())
  assert [r["run"] for r in rows] == ["first", "second"]
  assert "first" in (tmp_path / "summary.txt").read_text()
  (tmp_path / "first" / provenance.RESULT_JSON).write_text("{")  # damaged: left out, said, nothing else changed
  modes.train(tiny_config, tmp_path, name="third")
  assert [r["run"] for r in json.loads((tmp_path / "results.json").read_text())] == ["second", "third"]
  assert "first: left out of the workdir's summary" in capsys.readouterr().out


@pytest.mark.slow  # ~2 minutes: four launches on a 512-id vocabulary
def test_the_command_line_finds_a_killed_run_after_its_dataset_moved_refuses_another_model_and_repairs_its_log(
    prepared_dataset, tmp_path):
  data = shutil.copytree(prepared_dataset, tmp_path / "data")
  args = ["--config=smoke", *FAST, "--config.total_steps=40", "--config.checkpoint_every=1"]
  workdir = tmp_path / "work"
  _kill_after_first_checkpoint([*args, f"--config.data.path={data}"], workdir, tmp_path)
  moved = data.rename(tmp_path / "moved")
  out = launch("train", *args, f"--config.data.path={moved}", f"--workdir={workdir}", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "the dataset moved" in out.stdout and "resumed from" in out.stderr
  assert [p.name for p in workdir.iterdir() if p.is_dir()] == ["decoupled"]  # no second run beside it

  refused = launch("train", *args, f"--config.data.path={moved}", "--config.model.size=small",
                   f"--workdir={workdir}", cwd=tmp_path)
  assert refused.returncode == 2 and "Traceback" not in refused.stderr
  (line,) = [l for l in refused.stderr.splitlines() if l.startswith("error:")]
  assert "model.d_model: 64 there, 128 now" in line

  log = workdir / "decoupled" / "metrics.jsonl"
  log.write_text(log.read_text()[:-7])  # the last record torn, as a power loss leaves it
  again = launch("train", *args, f"--config.data.path={moved}", f"--workdir={workdir}", cwd=tmp_path)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "was cut short" in again.stderr and metrics.read_records(log)[1] == ""

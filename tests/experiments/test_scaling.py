"""The scaling study: its points, the best of each grid, gaps per seed, and a real study that resumes."""

import dataclasses
import json

import pytest

from configs import default
from launcher import FAST, launch
from runtime.errors import DataError, UsageError
from runtime.experiments import scaling
from runtime.reporting import summary


def _finish(workdir, point, eval_loss, params=1000, tokens=20_000, merges=7):
  """A finished point as the study leaves it: point.json, and results.json once its run ended."""
  out = workdir / point.name
  out.mkdir(parents=True)
  (out / scaling.POINT_FILE).write_text(json.dumps(dict(dataclasses.asdict(point), params=params)))
  (out / summary.RESULTS_FILE).write_text(json.dumps([dict(eval_loss=eval_loss, tokens=tokens, merges=merges)]))


def test_the_table_takes_the_best_of_each_grid_and_averages_the_per_seed_gaps(tmp_path):
  (tmp_path / scaling.STUDY_FILE).write_text(json.dumps(dict(config="configs/scaling.py", overrides=[])))
  for lr, loss in ((3e-3, 2.2), (6e-3, 2.0), (1.2e-2, 2.1)):
    _finish(tmp_path, scaling.Point("tiny", 0, lr, 8, 0), loss)
  _finish(tmp_path, scaling.Point("tiny", 0, 6e-3, 8, 1), 2.2)  # DP's best lr on seed 1
  for olr, loss in ((0.4, 2.1), (0.6, 2.04), (0.8, 2.3)):
    _finish(tmp_path, scaling.Point("tiny", 4, 6e-3, 8, 0, olr, 0.9), loss)
  _finish(tmp_path, scaling.Point("tiny", 4, 6e-3, 8, 1, 0.6, 0.9), 2.31)
  _finish(tmp_path, scaling.Point("tiny", 4, 6e-3, 8, 1, 0.4, 0.9), 2.0)  # not seed 0's best: not in the row
  (tmp_path / "tiny" / "unfinished").mkdir()
  (tmp_path / "tiny" / "unfinished" / scaling.POINT_FILE).write_text(
      json.dumps(dict(dataclasses.asdict(scaling.Point("tiny", 4, 6e-3, 8, 0, 1.0, 0.9)), params=1000)))

  dp, m4 = scaling.tabulate(tmp_path)
  assert (dp["M"], dp["inner_lr"], dp["batch"], dp["seeds"], dp["runs"]) == ("DP", 6e-3, 8, 2, 3)
  assert dp["eval_loss"] == pytest.approx(2.1)
  assert (m4["M"], m4["outer_lr"], m4["seeds"], m4["runs"]) == (4, 0.6, 2, 3)
  assert m4["gap_%"] == pytest.approx((2.0 + 5.0) / 2)  # 2.04 / 2.0 and 2.31 / 2.2, each against its seed's DP
  assert m4["gap_range_%"] == "+2.00..+5.00"
  assert (tmp_path / "scaling.png").exists() and "anchor" in (tmp_path / "scaling.txt").read_text()


def test_a_point_runs_dp_on_one_mesh_and_diloco_on_a_device_per_learner():
  dp = dict(scaling.Point("small", 0, 3e-3, 32, 1).fields(num_devices=8))
  assert dp == {"model.size": "small", "inner.lr": "0.003", "data.batch_size": "32", "seed": "1", "mode": "dp",
                "learners": "1", "num_devices": "8"}
  diloco = dict(scaling.Point("small", 4, 3e-3, 32, 0, 0.6, 0.9).fields(num_devices=8))
  assert (diloco["learners"], diloco["num_devices"], diloco["outer.lr"], diloco["outer.momentum"]) == \
      ("4", "4", "0.6", "0.9")
  assert "mode" not in diloco  # the config's own: decoupled


@pytest.mark.parametrize("grid,message", [
    (scaling.Grid(("huge",)), "--sizes"),
    (scaling.Grid(("tiny",), seeds=(1,)), "--seeds"),
    (scaling.Grid(("tiny",), outer_lrs=()), "--outer_lrs"),
    (scaling.Grid(("tiny",), outer_momenta=(1.0,)), "--outer_momenta"),
    (scaling.Grid(("tiny",), batch_sizes=(0,)), "--batch_sizes"),
])
def test_a_bad_grid_names_its_flag(grid, message):
  with pytest.raises(UsageError, match=message):
    grid.check()


def test_a_diverged_point_is_finished_without_a_loss_and_never_the_best(tmp_path, monkeypatch):
  # Regression: a diverged DiLoCo point failed the study on every rerun (a high outer lr stopped it for good).
  (tmp_path / scaling.STUDY_FILE).write_text(json.dumps(dict(config="configs/scaling.py", overrides=[])))
  _finish(tmp_path, scaling.Point("tiny", 0, 6e-3, 8, 0), 2.0)
  _finish(tmp_path, scaling.Point("tiny", 4, 6e-3, 8, 0, 0.6, 0.9), 2.1)
  high, broken = scaling.Point("tiny", 4, 6e-3, 8, 0, 1.0, 0.9), scaling.Point("tiny", 4, 6e-3, 8, 0, 0.8, 0.9)

  def run_points(points, *args):
    for name in points:
      (tmp_path / name / "log.txt").write_text("...\nerror: training diverged: 8 merges in a row committed nothing\n")
    (tmp_path / broken.name / "log.txt").write_text("Traceback ...\nValueError: something else\n")
    return {name: "exit 1" for name in points}

  monkeypatch.setattr(scaling.sweep, "run_points", run_points)
  monkeypatch.setattr(scaling.sweep, "restartable", lambda fields, config: fields)
  with pytest.raises(scaling.sweep.SweepFailed, match=r"1 study points failed \(tiny/M=4,olr=0.8"):
    scaling._run_points([high, broken], default.get_config(), "configs/scaling.py", [], tmp_path, 8, 1)
  assert (tmp_path / high.name / scaling.DIVERGED_FILE).exists()
  assert not (tmp_path / broken.name / scaling.DIVERGED_FILE).exists()
  _, m4 = scaling.tabulate(tmp_path)
  assert (m4["outer_lr"], m4["runs"]) == (0.6, 2)  # the diverged run counted, never the best


def test_a_workdir_without_a_study_or_with_a_damaged_point_is_one_line(tmp_path):
  with pytest.raises(UsageError, match="holds no study.json"):
    scaling.tabulate(tmp_path)
  (tmp_path / scaling.STUDY_FILE).write_text(json.dumps(dict(config="configs/scaling.py", overrides=[])))
  _finish(tmp_path, scaling.Point("tiny", 0, 6e-3, 8, 0), 2.0)
  (tmp_path / scaling.Point("tiny", 0, 6e-3, 8, 0).name / summary.RESULTS_FILE).write_text("[")
  with pytest.raises(DataError, match="is damaged"):
    scaling.tabulate(tmp_path)


@pytest.mark.slow  # ~2 minutes of subprocesses
def test_a_small_study_runs_dp_first_reruns_the_best_on_a_second_seed_and_resumes(tmp_path):
  fast = [f for f in FAST if f.split("=")[0] in ("--config.data.seq_len", "--config.model.max_len",
                                                  "--config.data.max_bytes", "--config.compile_cache")]
  args = ["--config=scaling", f"--workdir={tmp_path / 'study'}", "--sizes=tiny", "--learners=2",
          "--outer_lrs=0.5,0.7", "--outer_momenta=0.9", "--dp_lrs=6e-3,1.2e-2", "--batch_sizes=8", "--seeds=0,1", "--config.tokens_per_param=0.1",
          "--config.inner_steps=5", "--config.inner.warmup_steps=5", "--config.eval_batches=1",
          "--config.eval_batch_size=8", *fast]
  first = launch("scaling", *args, cwd=tmp_path)
  assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
  rows = json.loads((tmp_path / "study" / summary.RESULTS_FILE).read_text())
  assert [r["M"] for r in rows] == ["DP", 2] and [r["seeds"] for r in rows] == [2, 2]
  assert [r["runs"] for r in rows] == [2, 2]
  assert rows[1]["merges"] == rows[1]["tokens"] // (8 * 32 * 5)  # whole rounds: every merge holds both learners
  assert first.stdout.count("done in") == 2 + 2 + 2  # DP's grid, M=2's grid, then each best on seed 1
  again = launch("scaling", *args, cwd=tmp_path)
  assert again.returncode == 0 and "done in" not in again.stdout  # nothing ran twice

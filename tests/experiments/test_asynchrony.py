"""The asynchrony study runs in pieces: each cell's row is appended as it finishes, a cell with a row is skipped, a
row cut short by a kill is run again, and the table compares every cell with its group's K=M."""

import json
import math

import pytest

from runtime.errors import UsageError
from runtime.experiments import asynchrony


def _study(config, rows, **axes):
  config.clock.speeds = (1.0, 1.0, 1.3, 1.3)
  grid = asynchrony.Grid(**{"variants": ("K=M", "K=1+grace"), "lengths": ("steps",), **axes})
  return asynchrony.run(config, rows.parent, rows, "configs/default.py", "total_steps=16", grid)


def test_a_study_appends_a_row_per_cell_skips_cells_with_rows_and_reruns_a_row_cut_short(make_tiny_config, tmp_path,
                                                                                       monkeypatch):
  rows = tmp_path / "rows.jsonl"
  table = _study(make_tiny_config(), rows)
  written = asynchrony.read_rows(rows)
  assert [(r["variant"], r["length"], r["rule"]) for r in written] == [("K=M", "steps", "nesterov"),
                                                                       ("K=1+grace", "steps", "nesterov")]
  assert all(r["eval_loss"] > 0 and r["curve"] and r["tokens"] == written[0]["tokens"] for r in written)
  sync, grace = table
  assert sync["vs_K=M_%"] == 0 and sync["modeled_s_to_K=M_loss"] == sync["K=M_modeled_s"]
  assert grace["vs_K=M_%"] == pytest.approx(100 * (grace["eval_loss"] / sync["eval_loss"] - 1))
  assert grace["learners_per_merge"] < sync["learners_per_merge"] == 4

  trained = []
  real = asynchrony.train_one
  monkeypatch.setattr(asynchrony, "train_one", lambda run, *a: trained.append(run) or real(run, *a))
  same = lambda a, b: json.dumps(a) == json.dumps(b)  # (NaN as NaN)
  assert same(_study(make_tiny_config(), rows), table) and not trained  # every row there: nothing runs
  text = rows.read_text().splitlines()
  rows.write_text(text[0] + "\n" + text[1][: len(text[1]) // 2])  # killed while writing the second row
  _study(make_tiny_config(), rows)
  assert [(r.outer.quorum, r.outer.grace) for r in trained] == [(1, "adaptive")]  # only the cut one ran again
  again = asynchrony.read_rows(rows)
  figures = lambda row: {k: v for k, v in row.items() if k not in ("wall_s", "commit")}
  assert len(again) == 2 and same(figures(again[1]), figures(written[1]))  # the same row, to the bit


def test_another_axis_value_is_another_cell_and_bad_values_name_the_flag(make_tiny_config, tmp_path):
  rows = tmp_path / "rows.jsonl"
  rows.write_text(json.dumps(dict(setting="configs/default.py", overrides="total_steps=16", size="tiny",
                                  variant="K=M", length="steps", rule="nesterov", base="current", seed=0,
                                  eval_loss=2.0, curve=[[10.0, 2.0]], learners_per_merge=4, gathered=1,
                                  goodput=1.0)) + "\n")
  table = _study(make_tiny_config(), rows, variants=("K=M",), rules=("nesterov", "delayed_nesterov"))
  assert [(t["rule"], t["eval_loss"]) for t in table][0] == ("delayed_nesterov", table[0]["eval_loss"])
  assert [t["rule"] for t in table] == ["delayed_nesterov", "nesterov"] and table[1]["eval_loss"] == 2.0
  assert len(asynchrony.read_rows(rows)) == 2  # the nesterov cell had its row: only delayed Nesterov ran
  with pytest.raises(UsageError, match="--sizes: 'huge'.*tiny"):
    _study(make_tiny_config(), rows, sizes=("huge",))
  shown = asynchrony.run(make_tiny_config(), tmp_path, rows, "configs/default.py", "total_steps=16",
                         asynchrony.Grid(variants=("K=M", "K=1"), lengths=("steps",)), table_only=True)
  assert [t["variant"] for t in shown] == ["K=M"]  # nothing run, only the cells with rows shown
  assert math.isnan(asynchrony.tabulate([{**asynchrony.read_rows(rows)[0], "variant": "K=1"}])[0]["vs_K=M_%"])

"""Tests for the metrics writers and the report tables and plots."""

import math
import pathlib
import time

import numpy as np
import pytest

from runtime.reporting import metrics as metrics_lib
from runtime.reporting import summary
from runtime.reporting.metrics import MetricsLogger, read_jsonl, without_wall_time

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _train_records(steps: int = 3) -> list[dict[str, object]]:
  """Train and eval records for `steps` steps, as a MetricsLogger keeps them."""
  records: list[dict[str, object]] = []
  for step in range(1, steps + 1):
    at = {"step": step, "tokens": 100 * step, "time": float(step)}
    records.append({"kind": "train", **at, "loss": 3.0 / step})
    records.append({"kind": "eval", **at, "eval_loss": 3.5 / step})
  return records


def test_jsonl_round_trip_converts_numpy_scalars_and_keeps_nan(tmp_path: pathlib.Path):
  with MetricsLogger(tmp_path, run="r", progress=False, tensorboard=False) as logger:
    record = logger.log(
        "train",
        {
            "step": np.int64(7),
            "loss": np.float32(1.5),
            "grad_norm": np.array(float("nan")),
            "lr": float("inf"),
            "learners": [np.int32(1), 2.5],
            "partial": np.bool_(True),
            "note": "warmup",
        },
    )

  assert type(record["step"]) is int and type(record["loss"]) is float
  assert type(record["learners"][0]) is int and type(record["partial"]) is bool
  [read] = read_jsonl(tmp_path / "r" / "metrics.jsonl")
  assert math.isnan(read.pop("grad_norm"))
  assert read.pop("wall_time") == record["wall_time"]
  assert read == {
      "kind": "train", "step": 7, "loss": 1.5, "lr": math.inf, "learners": [1, 2.5],
      "partial": True, "note": "warmup",
  }


def test_each_record_is_on_disk_before_close(tmp_path: pathlib.Path):
  logger = MetricsLogger(tmp_path, progress=False, tensorboard=False)
  logger.log("train", {"step": 1, "loss": 2.0})
  logger.log("eval", {"step": 1, "eval_loss": 2.5})

  assert read_jsonl(tmp_path / "run" / "metrics.jsonl") == logger.records
  logger.close()


def test_log_rejects_the_reserved_kind_key_and_values_without_a_number(tmp_path: pathlib.Path):
  logger = MetricsLogger(None, progress=False)

  with pytest.raises(ValueError, match="'kind' is reserved"):
    logger.log("train", {"kind": "eval"})
  with pytest.raises(ValueError, match="'wall_time' is reserved"):
    logger.log("train", {"wall_time": 1.0})
  with pytest.raises(TypeError, match="metric 'config'"):
    logger.log("train", {"config": {"lr": 1.0}})
  assert logger.records == []


def test_log_after_close_raises(tmp_path: pathlib.Path):
  logger = MetricsLogger(tmp_path, progress=False, tensorboard=False)
  logger.close()
  logger.close()

  with pytest.raises(RuntimeError, match="closed"):
    logger.log("train", {"step": 1})


def test_tensorboard_event_file_is_written_under_tb(tmp_path: pathlib.Path):
  with MetricsLogger(tmp_path, run="r", progress=False) as logger:
    logger.log("train", {"tokens": 100, "loss": 2.0, "learners": [1, 2], "note": "skipped"})
    logger.log("eval", {"step": 3, "eval_loss": 2.5})

  events = list((tmp_path / "r" / "tb").glob("events.out.tfevents.*"))
  assert len(events) == 1 and events[0].stat().st_size > 0
  assert b"train/loss" in events[0].read_bytes() and b"wall_time" not in events[0].read_bytes()


def test_no_workdir_writes_nothing_and_keeps_records_in_memory(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
):
  monkeypatch.chdir(tmp_path)
  with MetricsLogger(None, progress=False) as logger:
    logger.log("train", {"step": 1, "loss": 2.0})

  assert list(tmp_path.iterdir()) == []
  [record] = logger.records
  assert record == {"kind": "train", "step": 1, "loss": 2.0, "wall_time": record["wall_time"]}


def test_every_record_ends_with_the_unix_time_it_was_logged_at(tmp_path: pathlib.Path):
  before = time.time()
  with MetricsLogger(tmp_path, run="r", progress=False, tensorboard=False) as logger:
    for step in range(1, 4):
      logger.log("train", {"step": step, "loss": 2.0})
      time.sleep(0.01)
    logger.log("fault", {"fault": "crash", "learner": 1})
  after = time.time()

  records = read_jsonl(tmp_path / "r" / "metrics.jsonl")
  wall_times = [record["wall_time"] for record in records]
  assert all(list(record)[-1] == "wall_time" for record in records)
  assert before <= wall_times[0] and wall_times[-1] <= after
  assert wall_times[0] < wall_times[1] < wall_times[2] <= wall_times[3]


@pytest.mark.parametrize(
    "progress, total_tokens", [(False, 1000), (True, None)], ids=["progress_off", "no_total"]
)
def test_disabled_progress_bar_prints_nothing(
    progress: bool, total_tokens: int | None, capsys: pytest.CaptureFixture[str]
):
  with MetricsLogger(None, total_tokens=total_tokens, progress=progress) as logger:
    logger.log("train", {"tokens": 500, "time": 1.0, "loss": 2.0})

  assert capsys.readouterr().err == ""


def test_progress_bar_says_compiling_until_the_first_step_then_real_and_modeled_rates_apart(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
):
  clock = iter([100.0, 102.0, 104.0])
  monkeypatch.setattr(metrics_lib.time, "time", lambda: next(clock))
  with MetricsLogger(None, total_tokens=1000) as logger:
    assert "compiling" in capsys.readouterr().err  # the bar before any step: the programs are being compiled
    logger.log("train", {"tokens": 400, "time": 2.0, "loss": 2.5})
    logger.log("eval", {"tokens": 400, "eval_loss": 2.75})
    logger.log("merge", {"tokens": 600, "time": 3.0})

  final = capsys.readouterr().err.split("\r")[-1]
  assert "600/1.00k" in final and "compiling" not in final
  assert "loss=2.5" in final and "eval_loss=2.75" in final
  assert "tok/s=50" in final  # 200 tokens in the 4 wall seconds since the first step
  assert "modeled tok/s=200" in final  # 600 tokens in 3 modeled seconds


def test_progress_bar_under_the_real_clock_shows_no_modeled_rate(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
  clock = iter([10.0, 12.0])
  monkeypatch.setattr(metrics_lib.time, "time", lambda: next(clock))
  with MetricsLogger(None, total_tokens=1000, time_kind="wall") as logger:
    logger.log("train", {"tokens": 400, "time": 2.0, "loss": 2.5})
    logger.log("train", {"tokens": 600, "time": 4.0, "loss": 2.4})

  final = capsys.readouterr().err.split("\r")[-1]
  assert "tok/s=100" in final and "modeled" not in final
  with pytest.raises(ValueError, match="time_kind='virtual'.*'modeled', 'wall'"):
    MetricsLogger(None, time_kind="virtual")


def test_summary_table_aligns_columns_and_formats_numbers():
  rows = [
      {"run": "diloco", "tokens": 1234567, "loss": 2.718281},
      {"run": "decoupled", "tokens": 89, "loss": 0.000123456, "extra": 1},
  ]

  text = summary.summary_table(rows, ["run", "tokens", "loss", "goodput"], title="Results")

  assert text.splitlines() == [
      "Results",
      "run           tokens       loss  goodput",
      "---------  ---------  ---------  -------",
      "diloco     1,234,567      2.718        -",
      "decoupled         89  0.0001235        -",
  ]


def test_summary_table_markdown_has_header_rule_and_escaped_cells():
  rows = [{"run": "a|b", "loss": 1.0}, {"run": "c"}]

  text = summary.summary_table(rows, ["run", "loss"], title="Results", markdown=True)

  assert text.splitlines() == [
      "**Results**",
      "",
      "| run  | loss |",
      "| ---- | ---: |",
      r"| a\|b |    1 |",
      "| c    |    - |",
  ]


def test_plot_curves_writes_a_png_and_creates_its_folder(tmp_path: pathlib.Path):
  runs = {"a": _train_records(), "b": _train_records()}

  path = summary.plot_curves(
      runs, tmp_path / "plots" / "loss.png", x=("tokens", "time"), log_y=True, time_kind="modeled"
  )

  assert path == tmp_path / "plots" / "loss.png"
  assert path.read_bytes().startswith(PNG_MAGIC)


def test_plot_curves_without_plottable_records_raises(tmp_path: pathlib.Path):
  runs = {"a": [{"kind": "train", "step": 1, "loss": 2.0}]}

  with pytest.raises(ValueError, match="x key 'tokens'"):
    summary.plot_curves(runs, tmp_path / "loss.png")
  assert not (tmp_path / "loss.png").exists()


def test_plot_timeline_writes_a_png(tmp_path: pathlib.Path):
  intervals = [
      ("learner 0", 0.0, 5.0, "training"),
      ("learner 0", 5.0, 6.0, "syncing"),
      ("learner 1", 0.0, 2.0, "down"),
      ("learner 1", 2.0, 6.0, "waiting"),
  ]

  path = summary.plot_timeline(intervals, [(5.0, "merge"), (6.0, "merge")], tmp_path / "t.png", time_kind="wall")

  assert path.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize(
    "intervals, events, message",
    [
        ([], [], "no intervals and no events"),
        ([("learner 0", 0.0, 1.0, "sleeping")], [], "state 'sleeping'"),
        ([("learner 0", 2.0, 1.0, "training")], [], "before its start"),
    ],
    ids=["empty", "unknown_state", "negative_interval"],
)
def test_plot_timeline_rejects_what_it_cannot_draw(
    intervals: list[tuple[str, float, float, str]],
    events: list[tuple[float, str]],
    message: str,
    tmp_path: pathlib.Path,
):
  with pytest.raises(ValueError, match=message):
    summary.plot_timeline(intervals, events, tmp_path / "t.png", time_kind="modeled")


def test_loss_curves_label_time_as_modeled_or_wall_loss_in_nats_per_byte_and_say_what_each_line_is():
  dp = _train_records()
  decoupled = [
      {"kind": "merge", "tokens": 100, "time": 1.0, "loss": 3.0},
      {"kind": "eval", "tokens": 100, "time": 1.0, "eval_loss": 3.2},
  ]

  for time_kind in ("modeled", "wall"):
    figure = summary.curves_figure({"dp": dp, "decoupled": decoupled}, x=("tokens", "time"),
                                   kinds=("train", "merge", "eval"), time_kind=time_kind)
    tokens_ax, time_ax = figure.axes
    assert [tokens_ax.get_xlabel(), time_ax.get_xlabel()] == ["tokens", f"{time_kind} time (s)"]
    assert tokens_ax.get_ylabel() == time_ax.get_ylabel() == "loss (nats/byte)"
    assert [text.get_text() for text in time_ax.get_legend().get_texts()] == [
        "dp train loss", "dp held-out eval loss",
        "decoupled merged learners' mean train loss", "decoupled held-out eval loss of Θ",
    ]


def test_a_time_axis_without_a_time_kind_is_refused(tmp_path: pathlib.Path):
  with pytest.raises(ValueError, match="time_kind=None .*'modeled', 'wall'"):
    summary.plot_curves({"a": _train_records()}, tmp_path / "loss.png", x=("time",))
  assert summary.curves_figure({"a": _train_records()}).axes[0].get_xlabel() == "tokens"


@pytest.mark.parametrize("time_kind", ["modeled", "wall"])
def test_timeline_labels_its_time_axis_as_modeled_or_wall(time_kind: str):
  figure = summary.timeline_figure([("learner 0", 0.0, 5.0, "training")], [(5.0, "merge")], time_kind=time_kind)

  assert figure.axes[0].get_xlabel() == f"{time_kind} time (s)"


def test_without_wall_time_removes_exactly_the_wall_times_the_logger_wrote(tmp_path: pathlib.Path):
  with MetricsLogger(tmp_path, run="r", progress=False, tensorboard=False) as logger:
    logger.log("merge", {"tokens": 1, "loss": float("nan"), "merged": [0, 1], "note": "wall_time"})
    logger.log("eval", {"eval_loss": -1e-07})
  text = (tmp_path / "r" / "metrics.jsonl").read_text()

  assert without_wall_time(text).splitlines() == [
      '{"kind": "merge", "tokens": 1, "loss": NaN, "merged": [0, 1], "note": "wall_time"}',
      '{"kind": "eval", "eval_loss": -1e-07}',
  ]

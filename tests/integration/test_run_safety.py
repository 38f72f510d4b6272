"""Runs that nothing can break, as a user meets them from a shell: a second process on the same run, a preemption
by SIGTERM, and a quiet run with injected crashes (slow: each launches real processes)."""

import json
import re
import signal
import time

import pytest

from launcher import REPO, launch
from runtime.checkpoint.store import DIGEST
from test_checkpoint import _start
from test_resume import DECOUPLED, _run_dir


def _wait_for(predicate, process, seconds: float = 300) -> None:
  deadline = time.monotonic() + seconds
  while not predicate():
    assert process.poll() is None and time.monotonic() < deadline, "the run ended or stalled first"
    time.sleep(0.05)


@pytest.mark.slow
def test_two_identical_runs_started_apart_one_trains_to_the_end_the_other_is_refused_naming_it(tmp_path):
  workdir = tmp_path / "w"
  first = _start([*DECOUPLED, f"--workdir={workdir}"], tmp_path)
  _wait_for(lambda: list(workdir.glob("*/run.json")), first)
  second = launch("train", *DECOUPLED, f"--workdir={workdir}", cwd=tmp_path)
  assert second.returncode == 2
  assert f"is in use by pid {first.pid} on " in second.stderr and "Traceback" not in second.stderr
  assert first.wait(timeout=600) == 0
  for metrics in workdir.glob("*/metrics.jsonl"):
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert sum(r["kind"] == "merge" for r in records) > 0
  assert json.loads((workdir / "results.json").read_text())[0]["run"] == _run_dir(workdir).name


@pytest.mark.slow
def test_a_sigterm_mid_run_saves_a_checkpoint_and_the_same_command_resumes_from_it(tmp_path):
  args = [*DECOUPLED, "--config.checkpoint_every=1000", "--config.total_steps=80", f"--workdir={tmp_path / 'w'}"]
  process = _start(args, tmp_path)
  _wait_for(lambda: '"kind": "merge"' in "".join(p.read_text() for p in tmp_path.glob("w/*/metrics.jsonl")),
            process)
  process.send_signal(signal.SIGTERM)
  assert process.wait(timeout=300) == 143
  log = max(tmp_path.glob("log-*.txt"), key=lambda p: p.stat().st_mtime).read_text()
  assert "Traceback" not in log
  (line,) = [l for l in log.splitlines() if l.startswith("interrupted at merge")]
  merge = int(line.split()[3])
  assert f"checkpoint {merge} saved; run the same command to resume" in line
  assert (tmp_path / "w" / _run_dir(tmp_path / "w").name / "checkpoints" / str(merge) / DIGEST).exists()
  out = launch("train", *args, cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"checkpoints/{merge} (merge {merge}," in out.stderr  # "resumed from <dir>/<merge> (merge N, ...)"


@pytest.mark.slow
def test_a_checkpointed_smoke_run_with_two_injected_crashes_is_quiet(tmp_path):
  out = launch("train", "--config=smoke", "--config.checkpoint_every=2", "--config.num_devices=5",
               "--config.slices=5", "--config.faults.schedule=crash:learner=1,time=4;crash:learner=2,time=9",
               f"--workdir={tmp_path / 'w'}", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = (out.stdout + out.stderr).splitlines()
  assert len(lines) <= 60, "\n".join(lines)
  assert "Traceback" not in out.stderr and "io_callback failed" not in out.stderr
  assert sum("down at t=" in l for l in lines) == 2  # each injected crash: one line


# An absl log line: severity, date, time, thread, the logging file and line.
_LOGGED = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ([\w.]+):\d+\]")


@pytest.mark.slow  # CI time (~20 s and ~60 s: real launches)
@pytest.mark.parametrize("config", ["smoke", "default"])
def test_a_shipped_run_prints_its_own_lines_and_none_from_a_librarys_logger(tmp_path, config):
  """Quiet by default: the run's table and paths, its own log lines; libraries' INFO (orbax's per save) dropped."""
  out = launch("train", f"--config={config}", f"--workdir={tmp_path / 'w'}", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = (out.stdout + out.stderr).splitlines()
  ours = {p.name for folder in ("runtime", "launch", "models", "configs") for p in (REPO / folder).rglob("*.py")}
  libraries = [l for l in lines if _LOGGED.match(l) and _LOGGED.match(l).group(1) not in ours]
  assert not libraries, "\n".join(libraries)
  progress = [l for l in lines if "%|" in l]  # (the progress bar: a line per update when not on a terminal)
  assert len(lines) - len(progress) <= 16, "\n".join(lines)

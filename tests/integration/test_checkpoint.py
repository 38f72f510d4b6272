"""Checkpoints: verified saves, corrupt ones skipped, and a data-parallel run killed and resumed bit for bit."""

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint._src.futures import synchronization
from orbax.checkpoint._src.multihost import multihost as orbax_multihost

from launcher import FAST, REPO, launch
from runtime.checkpoint.store import DIGEST, Checkpoints, problem
from runtime.config.run import from_config_dict
from runtime.errors import DataError
from runtime.experiments import modes
from runtime.reporting.metrics import read_jsonl
from runtime.trained import saved

DP = ["--config=smoke", *FAST, "--config.mode=dp", "--config.total_steps=12", "--config.eval_every=3",
      "--config.log_every=1", "--config.checkpoint_every=2"]


def _save_three(directory: pathlib.Path) -> Checkpoints:
  checkpoints = Checkpoints(directory, keep=3)
  for step in (1, 2, 3):
    checkpoints.save(step, {"w": jnp.full((64,), float(step))}, {"step": step, "data": {"position": step}})
    checkpoints._manager.wait_until_finished()  # pylint: disable=protected-access
  checkpoints.close()
  return checkpoints


def test_a_file_where_the_checkpoints_directory_should_be_is_one_line_naming_it(tmp_path):
  (tmp_path / "checkpoints").write_text("not a directory")
  with pytest.raises(DataError, match=r"checkpoints is not a directory of checkpoints \(a file is there\)"):
    Checkpoints(tmp_path / "checkpoints")
  assert (tmp_path / "checkpoints").read_text() == "not a directory"  # nothing there changed


def test_the_newest_sound_checkpoint_is_restored_with_its_metadata(tmp_path):
  _save_three(tmp_path)
  step, state, meta = Checkpoints(tmp_path).restore_latest({"w": jnp.zeros((64,))})
  assert step == 3 and meta == {"step": 3, "data": {"position": 3}}
  np.testing.assert_array_equal(np.asarray(state["w"]), np.full((64,), 3.0))
  assert all((tmp_path / str(s) / DIGEST).exists() for s in (1, 2, 3))


@pytest.mark.parametrize("damage", ["truncate", "random_bytes", "no_digest", "deleted_file"])
def test_a_damaged_latest_checkpoint_is_skipped_with_a_warning_naming_it(tmp_path, damage, caplog):
  _save_three(tmp_path)
  files = sorted(p for p in (tmp_path / "3").rglob("*") if p.is_file() and p.name != DIGEST)
  biggest = max(files, key=lambda p: p.stat().st_size)
  if damage == "truncate":
    biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])
  elif damage == "random_bytes":
    data = bytearray(biggest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    biggest.write_bytes(bytes(data))
  elif damage == "no_digest":
    (tmp_path / "3" / DIGEST).unlink()
  else:
    biggest.unlink()
  checkpoints = Checkpoints(tmp_path)
  step, state, _ = checkpoints.restore_latest({"w": jnp.zeros((64,))})
  assert step == 2 and float(state["w"][0]) == 2.0
  assert any(str(tmp_path / "3") in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)
  # The resumed run saves step 3 again, afresh (the damaged one is kept aside), and it is the one restored next.
  checkpoints.save(3, {"w": jnp.full((64,), 30.0)}, {"step": 3})
  checkpoints.close()
  step, state, _ = Checkpoints(tmp_path).restore_latest({"w": jnp.zeros((64,))})
  assert step == 3 and float(state["w"][0]) == 30.0
  assert (tmp_path.with_name(tmp_path.name + ".skipped") / "3").is_dir()


def test_with_checkpoints_none_of_them_sound_the_restore_is_refused_listing_each_and_nothing_is_moved(tmp_path):
  fresh = Checkpoints(tmp_path)
  assert fresh.restore_latest({"w": jnp.zeros((64,))}) is None  # no checkpoint: a fresh start
  fresh.close()
  _save_three(tmp_path)
  for step in (1, 2, 3):
    (tmp_path / str(step) / DIGEST).write_text("0" * 64 + "\n")
  with pytest.raises(DataError) as refused:
    Checkpoints(tmp_path).restore_latest({"w": jnp.zeros((64,))})
  message = str(refused.value)
  assert all(f"{s} (its files do not match their digest" in message for s in (1, 2, 3))
  assert "--config.resume=False" in message and "\n" not in message
  assert all((tmp_path / str(s)).is_dir() for s in (1, 2, 3))
  assert not tmp_path.with_name(tmp_path.name + ".skipped").exists()



def test_a_committed_checkpoint_is_verified_at_once_not_at_the_next_save(tmp_path):
  # Regression: the digest of checkpoint N was written only when save N+1 began (or at close), so a run killed in
  # between left N unverified: with nothing older verified, the rerun had nothing to resume from.
  checkpoints = Checkpoints(tmp_path, keep=3)
  checkpoints.save(1, {"w": jnp.full((64,), 1.0)}, {"step": 1})
  checkpoints._manager.wait_until_finished()  # pylint: disable=protected-access
  deadline = time.monotonic() + 10
  while not (tmp_path / "1" / DIGEST).exists() and time.monotonic() < deadline:
    time.sleep(0.01)
  assert (tmp_path / "1" / DIGEST).exists(), "checkpoint 1 committed but not verified until the next save"
  assert problem(tmp_path / "1") is None
  checkpoints.close()


def test_with_one_checkpoint_kept_a_kill_before_the_newest_is_verified_resumes_from_the_one_before(tmp_path,
                                                                                                   monkeypatch):
  # Regression: orbax pruned to `keep` as soon as a save committed, before its digest was written; with keep=1 a
  # kill in between left only an unverified checkpoint, and the rerun started from the beginning.
  checkpoints = Checkpoints(tmp_path, keep=1)
  checkpoints.save(1, {"w": jnp.full((64,), 1.0)}, {"step": 1})
  checkpoints.flush()
  monkeypatch.setattr(Checkpoints, "_digest_when_committed", lambda self, step: None)  # killed before its digest
  checkpoints.save(2, {"w": jnp.full((64,), 2.0)}, {"step": 2})
  checkpoints._manager.wait_until_finished()  # pylint: disable=protected-access
  assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [1, 2]
  monkeypatch.undo()
  step, state, _ = Checkpoints(tmp_path, keep=1).restore_latest({"w": jnp.zeros((64,))})
  assert step == 1 and float(state["w"][0]) == 1.0
  checkpoints = Checkpoints(tmp_path / "verified", keep=1)  # saves back to back: the one kept beside the newest
  for step in (1, 2, 3):  # is the one before it (each save waits for the previous one's digest), not the oldest
    checkpoints.save(step, {"w": jnp.full((64,), float(step))}, {"step": step})
  checkpoints._manager.wait_until_finished()  # pylint: disable=protected-access
  assert sorted(int(p.name) for p in (tmp_path / "verified").iterdir() if p.name.isdigit()) == [2, 3]
  checkpoints.close()  # and once every save is verified, one is kept
  assert Checkpoints(tmp_path / "verified").steps() == [3]


def test_a_damaged_digest_file_is_a_mismatch_and_the_checkpoint_before_is_restored(tmp_path):
  _save_three(tmp_path)
  (tmp_path / "3" / DIGEST).write_bytes(b"\xff" + (tmp_path / "3" / DIGEST).read_bytes()[1:])  # not even UTF-8
  assert "do not match their digest" in problem(tmp_path / "3")
  step, _, _ = Checkpoints(tmp_path).restore_latest({"w": jnp.zeros((64,))})
  assert step == 2


def test_a_run_stopped_before_verifying_any_checkpoint_starts_from_the_beginning_keeping_them_aside(tmp_path,
                                                                                                 caplog):
  _save_three(tmp_path)
  for step in (1, 2, 3):
    (tmp_path / str(step) / DIGEST).unlink()
  checkpoints = Checkpoints(tmp_path)
  assert checkpoints.restore_latest({"w": jnp.zeros((64,))}) is None  # what a stopped run said: it starts afresh
  checkpoints.close()
  assert all((tmp_path.with_name(tmp_path.name + ".skipped") / str(s)).is_dir() for s in (1, 2, 3))  # kept
  assert any("from the beginning" in r.getMessage() for r in caplog.records)
  damaged = tmp_path.with_name(tmp_path.name + "-damaged")  # one of them damaged: refused, as before
  _save_three(damaged)
  (damaged / "1" / DIGEST).write_text("0" * 64 + "\n")
  for step in (2, 3):
    (damaged / str(step) / DIGEST).unlink()
  with pytest.raises(DataError, match="1 \\(its files do not match their digest"):
    Checkpoints(damaged).restore_latest({"w": jnp.zeros((64,))})


@pytest.mark.slow  # ~20 s of CI; the refusal itself is tested above, in process
def test_a_run_whose_checkpoints_are_all_damaged_exits_2_listing_them_and_keeps_its_records(tmp_path):
  workdir = tmp_path / "w"
  out = launch("train", *DP, f"--workdir={workdir}", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  (metrics,) = workdir.glob("*/metrics.jsonl")
  before = metrics.read_bytes()
  steps = [p for p in workdir.glob("*/checkpoints/*") if p.is_dir()]
  for step in steps:
    (step / DIGEST).write_text("0" * 64 + "\n")
  out = launch("train", *DP, f"--workdir={workdir}", cwd=tmp_path)
  assert out.returncode == 2
  line, = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert all(f"{p.name} (its files do not match" in line for p in steps) and "Traceback" not in out.stderr
  assert metrics.read_bytes() == before


def _records(workdir: pathlib.Path) -> list[dict]:
  """The run's records without what wall clocks decide (its `wall` seconds and each record's `wall_time`)."""
  (path,) = workdir.glob("*/metrics.jsonl")
  return [{k: v for k, v in r.items() if k not in ("wall", "wall_time")} for r in read_jsonl(path)]


def _start(args: list[str], cwd: pathlib.Path) -> subprocess.Popen:
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["PYTHONPATH"] = str(REPO)
  # Output to a file, never a pipe nobody reads while the test waits: a full pipe would block the run.
  log = (cwd / f"log-{time.monotonic_ns()}.txt").open("w")
  return subprocess.Popen([sys.executable, "-m", "launch.train", *args], cwd=cwd, env=env,
                          stdout=log, stderr=subprocess.STDOUT, text=True)


def _killed_then_resumed(args: list[str], workdir: pathlib.Path, kills: int, rng: random.Random,
                         window: tuple[float, float] = (4.0, 14.0)) -> tuple[int, int]:
  """Runs `args` in `workdir`, SIGKILLs it up to `kills` times, each `window` seconds (uniform) after its start,
  then lets it finish; returns (kills, kills that landed while a save was unfinished)."""
  done = mid_save = 0
  while done < kills:
    process = _start([*args, f"--workdir={workdir}"], workdir.parent)
    time.sleep(rng.uniform(*window))
    if process.poll() is not None:
      break  # it finished first
    process.send_signal(signal.SIGKILL)
    process.wait()
    done += 1
    mid_save += any(not (p / DIGEST).exists() for p in workdir.glob("*/checkpoints/*") if p.is_dir())
  process = _start([*args, f"--workdir={workdir}"], workdir.parent)
  assert process.wait(timeout=600) == 0
  return done, mid_save


def _kill_after_first_checkpoint(args: list[str], workdir: pathlib.Path, cwd: pathlib.Path) -> None:
  """Starts `args` in `workdir` and SIGKILLs it as soon as one of its checkpoints is verified."""
  process = _start([*args, f"--workdir={workdir}"], cwd)
  deadline = time.monotonic() + 300
  while not list(workdir.glob("*/checkpoints/*/" + DIGEST)):
    assert process.poll() is None and time.monotonic() < deadline, "no verified checkpoint appeared"
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait()


def _reference(args: list[str], tmp_path: pathlib.Path) -> list[dict]:
  tmp_path.mkdir(parents=True, exist_ok=True)
  out = launch("train", *args, f"--workdir={tmp_path / 'reference'}", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  return _records(tmp_path / "reference")


@pytest.mark.slow  # CI time (~50 s on the 2-core host); `pytest -m slow` runs it
def test_a_killed_data_parallel_run_resumes_and_ends_bit_identical_to_an_unkilled_one(tmp_path):
  args = [*DP, "--config.total_steps=120", "--config.eval_every=20"]  # long enough to be killed mid-run
  reference = _reference(args, tmp_path)
  workdir = tmp_path / "killed"
  _kill_after_first_checkpoint(args, workdir, tmp_path)
  partial = len(_records(workdir))
  out = launch("train", *args, f"--workdir={workdir}", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resumed from" in out.stderr
  assert partial < len(reference) and _records(workdir) == reference  # eval losses included, in order


@pytest.mark.slow
def test_twenty_random_kills_across_seeds_never_lose_or_repeat_a_step(tmp_path):
  rng, kills, runs = random.Random(0), 0, 0
  for seed in (0, 1):
    args = [*DP, f"--config.seed={seed}"]
    start = time.monotonic()
    reference = _reference(args, tmp_path / f"seed{seed}")
    # Kills land from start-up to the end of a run as long as the reference took (a fixed window of 4-14 s never
    # killed a run that finished in under 4 s: the loop ran forever on an idle host).
    window = (0.2 * (time.monotonic() - start), time.monotonic() - start)
    while kills < 10 * (seed + 1):
      assert runs < 100, f"only {kills} of 20 kills landed in {runs} runs (window {window} s)"
      workdir, runs = tmp_path / f"seed{seed}" / f"killed{runs}", runs + 1  # a finished run cannot be killed again
      kills += _killed_then_resumed(args, workdir, 10 * (seed + 1) - kills, rng, window)[0]
      assert _records(workdir) == reference
  assert kills >= 20


@pytest.mark.slow  # CI time (~15 s on the 2-core host); `pytest -m slow` runs it
def test_a_different_config_in_the_workdir_is_refused_naming_the_fields(tmp_path):
  first = launch("train", *DP, f"--workdir={tmp_path}", cwd=tmp_path)
  assert first.returncode == 0, first.stderr[-2000:]
  (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
  again = launch("train", *DP, "--config.inner.lr=0.001", f"--workdir={tmp_path}", cwd=tmp_path)
  assert again.returncode == 2 and "inner.lr" in again.stderr and "Traceback" not in again.stderr
  # A run named differently goes to its own directory: the override is in its name, so no conflict there. The
  # same name with another value in a field the name does not carry is what is refused above.
  fresh = launch("train", *DP, "--config.resume=False", f"--workdir={tmp_path}", cwd=tmp_path)
  assert fresh.returncode == 0 and (tmp_path / f"{run_dir.name}.2" / "metrics.jsonl").exists()
  assert json.loads((run_dir / "run.json").read_text())["config"]["inner"]["lr"] == 0.003  # untouched


def test_a_mode_that_cannot_resume_yet_starts_afresh_beside_the_earlier_run_and_deletes_nothing(tiny_config, tmp_path,
                                                                                                 capsys):
  tiny_config.total_steps = 4
  modes.train(tiny_config, tmp_path)
  (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
  before = (run_dir / "metrics.jsonl").read_text()
  capsys.readouterr()
  modes.train(tiny_config, tmp_path)
  assert "cannot resume" in capsys.readouterr().out
  assert (run_dir / "metrics.jsonl").read_text() == before
  assert (tmp_path / f"{run_dir.name}.2" / "metrics.jsonl").exists()


def test_checkpoints_are_refused_in_modes_that_cannot_resume(tmp_path):
  out = launch("train", "--config=smoke", "--config.mode=dp_elastic", "--config.checkpoint_every=2",
               f"--workdir={tmp_path}", cwd=tmp_path)
  assert out.returncode == 2 and "checkpoint_every" in out.stderr and "'decoupled'" in out.stderr


def test_a_byte_flipped_deep_inside_a_large_file_makes_the_checkpoint_skipped(tmp_path):
  like = {"w": jnp.zeros((1 << 19,))}  # 2 MiB of arrays: the flip lies past the file's first MiB
  checkpoints = Checkpoints(tmp_path)
  for step in (1, 2):
    checkpoints.save(step, {"w": jnp.full(like["w"].shape, float(step))}, {"step": step})
    checkpoints._manager.wait_until_finished()  # pylint: disable=protected-access
  checkpoints.close()
  biggest = max((p for p in (tmp_path / "2").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  data = bytearray(biggest.read_bytes())
  assert len(data) > 3 << 19
  data[len(data) * 3 // 4] ^= 0xFF
  biggest.write_bytes(bytes(data))
  step, state, _ = Checkpoints(tmp_path).restore_latest(like)
  assert step == 1 and np.all(np.asarray(state["w"]) == 1.0)


def test_a_model_saved_while_checkpoints_are_saved_on_another_thread_breaks_neither(make_tiny_config, tmp_path,
                                                                                  monkeypatch):
  """Orbax keys each save's background signals by one counter per process: a model save (`save_model_every`, the
  controller's thread) started while a checkpoint save started on another thread (the saver's) waited 300 s for a
  signal sent under the other's number, or renamed the other's temporary directory."""
  monkeypatch.setattr(orbax_multihost, "_DEFAULT_BARRIER_TIMEOUT", 10)  # a lost signal fails in 10 s, not 300
  run = from_config_dict(make_tiny_config())
  numbered = synchronization.OperationIdGenerator.next_operation_id.__func__

  def slowly_numbered(cls):  # widens the window in which another thread's save can take the next number
    number = numbered(cls)
    time.sleep(0.05)
    return number

  monkeypatch.setattr(synchronization.OperationIdGenerator, "next_operation_id", classmethod(slowly_numbered))
  errors, rounds = [], 20

  def checkpointing():
    checkpoints = Checkpoints(tmp_path / "checkpoints", keep=2)
    try:
      for step in range(1, rounds + 1):
        checkpoints.save(step, {"w": jnp.full((64,), float(step))}, {"step": step})
      checkpoints.flush()
    except Exception as error:  # pylint: disable=broad-except
      errors.append(error)
    finally:
      checkpoints.close(quiet=True)

  def modelling():
    try:
      for merge in range(rounds):
        saved.save(tmp_path / "models" / f"merge-{merge}", run, {"w": np.full((64,), float(merge), np.float32)},
                   run_name="concurrent", tokens=merge, eval_loss=1.0, merge=merge)
    except Exception as error:  # pylint: disable=broad-except
      errors.append(error)

  threads = [threading.Thread(target=checkpointing), threading.Thread(target=modelling)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert not errors, errors
  assert Checkpoints(tmp_path / "checkpoints").steps() == [rounds, rounds - 1]
  assert all((tmp_path / "models" / f"merge-{m}" / "params").is_dir() for m in range(rounds))


# The smoke run as shipped (checkpoints on by default), with a wall interval short enough to checkpoint mid-run.
SMOKE = ["--config=smoke", "--config.progress=False", "--config.tensorboard=False",
         f"--config.compile_cache={FAST[-1].partition('=')[2]}"]


@pytest.mark.slow  # CI time (~90 s on the 2-core host: three launches)
@pytest.mark.parametrize("wall_seconds", [1.0, None])
def test_the_smoke_run_killed_mid_run_resumes_with_the_same_command_and_ends_with_an_unkilled_runs_records(
    tmp_path, wall_seconds):
  """Checkpoints are on by default: a SIGKILLed smoke run, run again as it was, ends as the run never killed, from a
  checkpoint of the default wall interval's kind (every second here), or killed before any (the default 120 s) from
  the start, in its own directory (not refused as unfinished and never checkpointed)."""
  args = SMOKE + ([f"--config.checkpoint_wall_seconds={wall_seconds}"] if wall_seconds else [])
  reference = _reference(args, tmp_path)
  workdir = tmp_path / "killed"
  if wall_seconds:
    _kill_after_first_checkpoint(args, workdir, tmp_path)
  else:
    process = _start([*args, f"--workdir={workdir}"], tmp_path)
    while not list(workdir.glob("*/metrics.jsonl")) or not _records(workdir):
      assert process.poll() is None, "the run ended before it could be killed"
      time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
  assert 0 < len(_records(workdir)) < len(reference)  # killed mid-run
  out = launch("train", *args, f"--workdir={workdir}", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert ("resumed from" in out.stderr) == bool(wall_seconds)
  assert _records(workdir) == reference


class _Killed(Exception):
  """The run stopped as a kill would stop it."""


def test_dp_checkpoints_by_the_hosts_clock_alone_and_resumes_bit_identical(tiny_config, tmp_path, monkeypatch):
  """checkpoint_wall_seconds (on by default) checkpoints dp too: a run stopped at a save resumes to the same records
  and parameters as the run never stopped."""
  tiny_config.mode, tiny_config.checkpoint_wall_seconds = "dp", 1e-6  # (a save every step)
  reference = modes.train(tiny_config, tmp_path / "reference")[0]
  save = Checkpoints.save

  def dying(self, step, *args, **kwargs):
    if step == 7:
      raise _Killed()
    return save(self, step, *args, **kwargs)

  with monkeypatch.context() as patch:
    patch.setattr(Checkpoints, "save", dying)
    with pytest.raises(_Killed):
      modes.train(tiny_config, tmp_path / "killed")
  result = modes.train(tiny_config, tmp_path / "killed")[0]
  assert _records(tmp_path / "killed") == _records(tmp_path / "reference")
  assert result.final_eval_loss == reference.final_eval_loss
  steps = [int(p.name) for p in (tmp_path / "killed" / "dp" / "checkpoints").iterdir() if p.name.isdigit()]
  assert max(steps) == 16  # (the final step's)

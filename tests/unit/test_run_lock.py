"""One process per run directory, and workdir outputs written as one set (issue: runs that nothing can break)."""

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from configs import smoke
from launcher import REPO
from runtime.config.run import from_config_dict
from runtime.errors import UsageError
from runtime.reporting import provenance
from runtime.run_lock import RunLock, outputs_of, write_atomically


def _files(run_dir: pathlib.Path) -> dict[str, bytes]:
  return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}


def test_a_second_claim_of_a_held_run_is_refused_naming_its_holder_and_touches_nothing(tmp_path):
  run = dataclasses.replace(from_config_dict(smoke.get_config()), checkpoint_every=2)  # a run that can resume
  name, lock = provenance.claim(tmp_path, "decoupled", run, resumable=True)
  provenance.write(run, tmp_path / name, name)
  before = _files(tmp_path / name)
  with pytest.raises(UsageError, match=rf"run 'decoupled' in {tmp_path} is in use by pid {os.getpid()} on .* since "
                                       r".*; wait for it, or use another --workdir"):
    provenance.claim(tmp_path, "decoupled", run, resumable=True)
  assert _files(tmp_path / name) == before
  lock.release()
  name, lock = provenance.claim(tmp_path, "decoupled", run, resumable=True)  # free again: the same run resumes
  assert name == "decoupled"
  lock.release()


def test_a_run_that_cannot_resume_goes_beside_a_held_run_only_if_that_one_is_free(tmp_path):
  run = from_config_dict(smoke.get_config())
  _, lock = provenance.claim(tmp_path, "dp", run, resumable=False)
  provenance.write(run, tmp_path / "dp", "dp")
  (tmp_path / "dp" / provenance.RESULT_JSON).write_text("{}")  # it ran to its end
  with pytest.raises(UsageError, match="in use by"):
    provenance.claim(tmp_path, "dp", run, resumable=False)
  lock.release()
  name, lock = provenance.claim(tmp_path, "dp", run, resumable=False)
  assert name == "dp.2"
  lock.release()


def test_the_lock_of_a_killed_process_is_released_by_the_kernel(tmp_path):
  code = ("import os, pathlib, signal; from runtime.run_lock import RunLock; "
          f"RunLock.take(pathlib.Path({str(tmp_path)!r}), 'decoupled'); os.kill(os.getpid(), signal.SIGKILL)")
  done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)), check=False)
  assert done.returncode == -signal.SIGKILL
  assert json.loads((tmp_path / "decoupled" / ".lock").read_text())["pid"] != os.getpid()
  RunLock.take(tmp_path, "decoupled").release()


def test_workdir_outputs_are_replaced_whole_or_not_at_all(tmp_path):
  target = tmp_path / "results.json"
  target.write_text("old\n")

  def half_then_fail(tmp: pathlib.Path) -> None:
    tmp.write_text("half")
    raise OSError(28, "No space left on device", str(tmp))

  with outputs_of(tmp_path), pytest.raises(OSError):
    write_atomically(target, half_then_fail)
  assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == [".outputs.lock",
                                                                                        "results.json"]
  with outputs_of(tmp_path):
    write_atomically(target, lambda tmp: tmp.write_text("new\n"))
  assert target.read_text() == "new\n"

"""A full disk or an unwritable path ends a run in one line (exit 1); anything else keeps its traceback."""

import errno

import jax.numpy as jnp
import pytest

from runtime import cli
from runtime.checkpoint import storage
from runtime.checkpoint.store import Checkpoints


def _full_disk_under_orbax(path: str):
  def save():
    try:
      raise OSError(errno.ENOSPC, "No space left on device", path)
    except OSError as error:
      raise RuntimeError("Event loop is closed") from error  # (a library's own error, raised from the OS's)
  return save


def test_a_full_disk_under_a_librarys_error_is_one_line_naming_the_path_and_exit_1():
  with pytest.raises(SystemExit) as stopped:
    cli.guarded(_full_disk_under_orbax("/w/decoupled/checkpoints/7.orbax-checkpoint-tmp-1/state/d/0"))
  message = stopped.value.code
  assert isinstance(message, str) and "\n" not in message  # sys.exit(text): the text on stderr, status 1
  assert message.startswith("error: /w/decoupled/checkpoints/7.orbax-checkpoint-tmp-1/state/d/0: No space left on "
                            "device (ENOSPC); ")
  assert "run the same command to resume" in message


def test_an_error_that_is_not_the_disks_keeps_its_traceback():
  def bug():
    raise KeyError("a genuine bug")
  with pytest.raises(KeyError):
    cli.guarded(bug)
  assert storage.os_error_in(FileNotFoundError(errno.ENOENT, "missing")) is None  # not a storage failure


def test_closing_after_a_failure_removes_the_unfinished_save_and_keeps_the_checkpoints(tmp_path):
  checkpoints = Checkpoints(tmp_path)
  checkpoints.save(1, {"w": jnp.ones((8,))}, {"step": 1})
  checkpoints.flush()
  unfinished = tmp_path / "2.orbax-checkpoint-tmp-1234"
  (unfinished / "state").mkdir(parents=True)
  checkpoints.close(quiet=True)
  checkpoints.close(quiet=True)  # (closing twice does nothing)
  assert not unfinished.exists() and Checkpoints(tmp_path).steps() == [1]

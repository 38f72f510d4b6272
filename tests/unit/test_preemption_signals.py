"""The signal handlers: a first SIGTERM or SIGINT asks for a stop; a second one exits at once."""

import os
import signal
import subprocess
import sys

import pytest

from launcher import REPO
from runtime.train import preemption

_TWICE = """
import os, signal, time
from runtime.train import preemption
with preemption.handling():
  os.kill(os.getpid(), signal.{name})
  assert preemption.requested() == signal.{name}
  print("asked", flush=True)
  os.kill(os.getpid(), signal.{name})  # (a save would be in progress here)
  time.sleep(30)
print("not reached")
"""


@pytest.mark.parametrize("name,code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_second_signal_exits_at_once_with_its_code(name, code):
  done = subprocess.run([sys.executable, "-c", _TWICE.format(name=name)], capture_output=True, text=True, timeout=20,
                        env=dict(os.environ, PYTHONPATH=str(REPO)), check=False)
  assert done.returncode == code and done.stdout == "asked\n"
  assert f"{name}: stopping after the step in progress" in done.stderr
  assert f"{name} again: stopping at once" in done.stderr and "Traceback" not in done.stderr


def test_outside_its_block_a_signal_behaves_as_before_and_no_request_is_left():
  before = signal.getsignal(signal.SIGTERM)
  with preemption.handling():
    assert signal.getsignal(signal.SIGTERM) is not before
  assert signal.getsignal(signal.SIGTERM) is before and preemption.requested() is None


_TWICE_WITH_CHECKPOINTS = """
import os, pathlib, signal, time
from runtime.checkpoint.store import Checkpoints
from runtime.train import preemption
store = Checkpoints({directory!r})
for step in {verified!r} + (9,):  # 9: committed by orbax, its digest not yet written (restore would skip it)
  (pathlib.Path({directory!r}) / str(step)).mkdir()
  (pathlib.Path({directory!r}) / str(step) / "commit_success.txt").write_text("")
  if step != 9:
    (pathlib.Path({directory!r}) / str(step) / "digest.sha256").write_text("0" * 64)
with preemption.handling():
  os.kill(os.getpid(), signal.SIGTERM)
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(30)
"""


@pytest.mark.parametrize("verified,said", [((), "no checkpoint under {directory} is verified yet"),
                                           ((3, 7), "checkpoint 7 under {directory} is the newest verified")])
def test_a_second_signal_says_what_is_on_disk(tmp_path, verified, said):
  directory = str(tmp_path / "checkpoints")
  done = subprocess.run([sys.executable, "-c", _TWICE_WITH_CHECKPOINTS.format(directory=directory,
                                                                               verified=verified)],
                        capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)),
                        check=False)
  assert done.returncode == 143, done.stderr[-2000:]
  assert said.format(directory=directory) in done.stderr

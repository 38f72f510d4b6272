"""Runs the real launchers in a subprocess, as a user would from a shell (tests only)."""

import os
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
# Small enough that a whole launch.train run is mostly start-up (two learners, one device each).
FAST = ["--config.learners=2", "--config.num_devices=2", "--config.total_steps=4", "--config.inner_steps=2",
        "--config.data.seq_len=32", "--config.model.max_len=32", "--config.data.max_bytes=200000",
        "--config.eval_every=2", "--config.eval_batches=1", "--config.progress=False", "--config.tensorboard=False",
        f"--config.compile_cache={os.path.join(tempfile.gettempdir(), 'decoupled-diloco-test-xla-cache')}"]


def launch(module: str, *args: str, cwd: pathlib.Path, importtime: bool = False) -> subprocess.CompletedProcess:
  """Runs `python -m launch.<module> args` in `cwd` (not the repository) and returns what it printed."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # as in a user's shell, not the test session's
  env["PYTHONPATH"] = str(REPO)
  command = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", f"launch.{module}", *args]
  return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


def imported_jax(stderr: str) -> bool:
  """Says whether a `-X importtime` log shows the jax package imported."""
  return any(line.rsplit("|", 1)[-1].strip() == "jax" for line in stderr.splitlines() if line.startswith("import time"))

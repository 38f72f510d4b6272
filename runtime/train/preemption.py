"""Preemption: SIGTERM (how clusters preempt) and SIGINT ask the run to stop; the training loop saves and stops.

`handling()` installs the handlers for the duration of a launcher's job (main thread only). The first signal only
records a request: the loop finishes the step in progress, saves a checkpoint of its state as it stands, waits for
it to be committed and verified, and raises `Interrupted`, which the command line prints as one line and exits with
128 + the signal's number (143, 130). A second signal exits at once (the save in progress is never committed, so
the previous checkpoint stays the newest), saying what is on disk: the checkpoints each run's store reports.
"""

import contextlib
import os
import signal
import threading
from typing import Callable, Iterator

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_requested: list[int] = []  # the signal received, if any
_on_disk: list[Callable[[], str]] = []  # each open checkpoint store's account of what it has committed


class Interrupted(Exception):
  """The run stopped on a signal; the message says where, and whether a checkpoint was saved."""

  def __init__(self, message: str, signum: int):
    super().__init__(message)
    self.exit_code = 128 + signum


def requested() -> int | None:
  """The signal that asked the run to stop, or None."""
  return _requested[0] if _requested else None


def _handle(signum: int, frame) -> None:
  del frame
  if _requested:
    found = "; ".join(_described(describe) for describe in _on_disk) or "this process has no checkpoint to resume from"
    os.write(2, f"\n{signal.Signals(signum).name} again: stopping at once, the save in progress abandoned; "
                f"{found}\n".encode())
    os._exit(128 + signum)  # pylint: disable=protected-access
  _requested.append(signum)
  os.write(2, f"\n{signal.Signals(signum).name}: stopping after the step in progress (again to stop at "
              "once)\n".encode())


@contextlib.contextmanager
def handling() -> Iterator[None]:
  """SIGTERM and SIGINT request a stop while inside (outside the main thread: nothing is installed)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {s: signal.signal(s, _handle) for s in _SIGNALS}
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    _requested.clear()


def _described(describe: Callable[[], str]) -> str:
  """`describe()`, or a line saying it failed: the exit at once never waits on it nor fails with it."""
  try:
    return describe()
  except Exception as error:  # pylint: disable=broad-except
    return f"what is on disk could not be read ({type(error).__name__}: {error})"


def watch(describe: Callable[[], str]) -> None:
  """A checkpoint store opened: a second signal says what `describe()` finds it has committed."""
  _on_disk.append(describe)


def unwatch(describe: Callable[[], str]) -> None:
  """The store closed."""
  if describe in _on_disk:
    _on_disk.remove(describe)


def stop_message(where: str, saved: str | None) -> str:
  """The line a stopped run prints: where it stopped and how to go on."""
  if saved is None:
    return (f"interrupted at {where}; checkpoints are off (checkpoint_every = checkpoint_seconds = 0), so the run "
            "cannot resume: turn them on to make a run preemptible")
  return f"interrupted at {where}; {saved}; run the same command to resume"

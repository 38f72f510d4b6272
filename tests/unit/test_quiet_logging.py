"""Quiet by default: libraries' INFO lines and injected crashes' tracebacks are dropped; our lines and errors stay."""

import logging

from absl import logging as absl_logging

from runtime import cli
from runtime.faults import injection


def _record(pathname: str, level: int, exc: BaseException | None = None) -> logging.LogRecord:
  return logging.LogRecord("absl", level, pathname, 1, "message", (), (type(exc), exc, None) if exc else None)


def test_library_info_is_dropped_unless_asked_and_our_info_and_every_warning_stay():
  cli.quiet_libraries()
  handler = absl_logging.get_absl_handler()
  orbax = "/site-packages/orbax/checkpoint/checkpoint_manager.py"
  ours = str(cli.CONFIGS_DIR.parent / "runtime" / "diloco" / "durability.py")
  assert not handler.filter(_record(orbax, logging.INFO))
  assert handler.filter(_record(orbax, logging.WARNING)) and handler.filter(_record(ours, logging.INFO))
  cli.quiet_libraries()  # (installed once)
  assert sum(isinstance(f, cli._OwnInfoOnly) for f in handler.filters) == 1  # pylint: disable=protected-access


def test_an_injected_crash_is_not_logged_by_jax_with_a_traceback_but_a_genuine_callback_error_is():
  injection.Injector(1)
  callbacks = logging.getLogger("jax._src.callback")
  crash = injection.SliceCrash("injected crash of learner 0's slice at inner step 3")
  assert not callbacks.filter(_record("callback.py", logging.ERROR, crash))
  assert callbacks.filter(_record("callback.py", logging.ERROR, ValueError("a genuine bug in a callback")))

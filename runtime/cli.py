"""The command line's boundary: configs found by name or path, `--help` with every field, one-line errors (exit 2).

Every launcher calls `run(main)` instead of `absl.app.run(main)` and `launch(...)` inside `main`. What the user
typed is checked before JAX or the corpus is touched: the config file, each `--config.FIELD` override (with a
suggestion for a misspelled one), the whole typed config, and the workdir. A usage or config error prints one
line and exits with status 2; a run that diverged, or that a full disk or an unwritable path stopped, exits with
status 1; a run stopped by SIGTERM or SIGINT (runtime/train/preemption.py) exits with 143 or 130, one line each;
anything else is a bug and keeps its traceback. Libraries' INFO logging is off unless --verbosity is given.
"""

import contextlib
import ctypes
import difflib
import logging
import importlib
import importlib.util
import os
import pathlib
import sys
import traceback
from typing import Any, Callable, Iterator, Sequence

import ml_collections
from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

import configs
from runtime.config import docs as config_docs
from runtime.config.run import MOVED, QUIET_FIELDS, from_config_dict
from runtime.errors import ConfigError, DataError, TrainingDiverged, UsageError
from runtime.train import preemption
from runtime.checkpoint import storage

USAGE_EXIT = 2
CONFIGS_DIR = pathlib.Path(configs.__file__).resolve().parent
_HELP_FLAGS = ("--help", "-help", "-h", "--helpfull", "--helpshort", "-?")


def config_path(name_or_path: str) -> str:
  """A config given as a path (from any directory), or by name ('smoke', 'smoke.py', 'configs/smoke.py')."""
  text, colon, arg = name_or_path.partition(":")
  path = pathlib.Path(text).expanduser()
  candidates = [path, CONFIGS_DIR / path.name, CONFIGS_DIR / f"{path.name}.py"]
  for candidate in candidates if text else ():
    if candidate.is_file():
      return str(candidate if candidate.is_absolute() else candidate.resolve()) + colon + arg
  names = sorted(p.stem for p in CONFIGS_DIR.glob("*.py") if p.stem != "__init__")
  raise UsageError(f"--config={name_or_path}: no such config file (looked for {text!r} from {os.getcwd()} and in "
                   f"{CONFIGS_DIR}); allowed a path to a config file or one of the names {names}")


def load_config(name_or_path: str) -> ml_collections.ConfigDict:
  """Runs a config file's get_config() as config_flags will, but names the file and line of any failure."""
  path, _, arg = config_path(name_or_path).partition(":")
  try:
    spec = importlib.util.spec_from_file_location(f"_config_{pathlib.Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()
  except SyntaxError as error:
    raise UsageError(f"--config={name_or_path}: syntax error at {error.filename}:{error.lineno}: {error.msg}") from None
  except Exception as error:  # pylint: disable=broad-except
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == path]
    where = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
    raise UsageError(f"--config={name_or_path}: loading the config failed{where}: {type(error).__name__}: "
                     f"{error}") from None


def _config_arg(argv: Sequence[str], default: str) -> str:
  """The last value given to --config in `argv` (--config=X or --config X; the last wins, as in absl)."""
  value = default
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      value = arg.split("=", 1)[1]
    elif arg == "--config" and i + 1 < len(argv):
      value = argv[i + 1]
  return value


def _with_config_path(argv: Sequence[str], path: str) -> list[str]:
  """`argv` with each --config value given replaced, in place, by the resolved `path`.

  When none is given the flag's default stays (config_flags has parsed it already, and reads its overrides
  from sys.argv itself).
  """
  out, skip = [], False
  for i, arg in enumerate(argv):
    if skip:
      skip = False
    elif arg.startswith("--config=") or (arg == "--config" and i + 1 < len(argv)):
      out.append(f"--config={path}")
      skip = arg == "--config"
    else:
      out.append(arg)
  return out


def check_overrides(argv: Sequence[str], config: ml_collections.ConfigDict) -> None:
  """Every --config.FIELD in `argv` names a field of `config`; a misspelled one gets a suggestion."""
  fields = config_docs.flatten(config)
  sections = {f.rpartition(".")[0] for f in fields}
  for arg in argv:
    if not arg.startswith("--config."):
      continue
    field = arg[len("--config."):].split("=", 1)[0]
    if field in fields or field in sections:
      continue
    leaf = field.rpartition(".")[2]
    close = ([MOVED[field]] if field in MOVED else difflib.get_close_matches(field, fields, n=1)
             or [f for f in fields if f.endswith(f".{leaf}")][:1])
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise UsageError(f"unknown config field '{field}' ({arg}): {hint}allowed one of the {len(fields)} fields "
                     "that --help lists")


def define_config(default: str, help_string: str) -> Any:
  """`--config` (config_flags.DEFINE_config_file) with its default found by name from any directory.

  config_flags parses the default at definition when --config is not given, reading the overrides from sys.argv:
  they are checked first, so that a misspelled field is one line (exit 2), not a traceback at import.
  """
  with _usage_errors(sys.argv):
    path = config_path(default)
    if _config_arg(sys.argv[1:], "") == "":
      check_overrides(sys.argv[1:], load_config(path))
    return config_flags.DEFINE_config_file("config", path, help_string)


def check_workdir(workdir: str | None, flag: str = "--workdir") -> None:
  """The workdir exists or can be created, and is writable."""
  if not workdir:
    return
  path = pathlib.Path(workdir).expanduser()
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / ".write_probe"
    probe.write_text("")
    probe.unlink()
  except OSError as error:
    raise UsageError(f"{flag}={workdir}: cannot be created or written ({error.strerror or error}); allowed a "
                     "directory this user can create and write") from None


def fail(message: object) -> None:
  """Prints `error: message` and a pointer to --help on stderr; exits with status 2."""
  print(f"error: {message}\n(run with --help to list every flag and config field)", file=sys.stderr)
  sys.exit(USAGE_EXIT)


@contextlib.contextmanager
def _usage_errors(argv: Sequence[str]) -> Iterator[None]:
  """Shows a usage error raised inside as one line and exits 2: ours, absl's, and config_flags' own."""
  try:
    yield
  except (UsageError, flags.Error) as error:
    fail(error)
  except (AttributeError, KeyError, TypeError, ValueError) as error:  # config_flags' override errors
    fail(f"{' '.join(a for a in argv[1:] if a.startswith('--config'))}: {error}")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with help (exit 0) and every usage error shown as one line (exit 2)."""
  config_flag = flags.FLAGS["config"] if "config" in flags.FLAGS else None
  with _usage_errors(argv):
    if config_flag is not None:
      given = _config_arg(argv[1:], config_flag.default_as_str.strip("'\""))
      path = config_path(given)
      argv = _with_config_path(argv, path)
      config = load_config(path)
      if any(arg in _HELP_FLAGS for arg in argv[1:]):
        print(_launcher_help(argv[0]))
        print()
        print(config_docs.help_text(config, path.partition(":")[0]))
        sys.exit(0)
      check_overrides(argv[1:], config)
    elif any(arg in _HELP_FLAGS for arg in argv[1:]):
      print(_launcher_help(argv[0]))
      sys.exit(0)
    return flags.FLAGS(argv)
  raise AssertionError("unreachable")


def _launcher_help(program: str) -> str:
  """The launcher's own flags (not absl's), with their defaults."""
  module = sys.modules["__main__"]
  doc = (module.__doc__ or "").strip()
  own = flags.FLAGS.get_flags_for_module(sys.argv[0]) or flags.FLAGS.get_flags_for_module(module.__name__)
  own += [flags.FLAGS["config"]] if "config" in flags.FLAGS else []  # defined here, by define_config
  lines = [doc, "", f"usage: python -m {_module_name(program)} [--flag=value ...] [--config.FIELD=value ...]", "",
           "Flags:"]
  for flag in sorted(own, key=lambda f: f.name):
    lines.append(f"  --{flag.name}={flag.default_as_str}")
    lines.append(f"      {flag.help}")
  return "\n".join(lines)


def _module_name(program: str) -> str:
  """`launch.train` for a launcher started as `python -m launch.train`."""
  path = pathlib.Path(program).resolve()
  return f"{path.parent.name}.{path.stem}" if path.parent.name == "launch" else path.name


def run(main: Callable[[list[str]], None]) -> None:
  """`absl.app.run(main)` with this module's flag parsing, and libraries' INFO logging off (see `quiet_libraries`)."""

  def quiet_main(argv: list[str]) -> None:
    quiet_libraries()
    main(argv)

  app.run(quiet_main, flags_parser=parse_flags)


class _OwnInfoOnly(logging.Filter):
  """Lets through warnings and errors, and the INFO lines of this repository's own modules; a library's report of a
  storage error is dropped (the run ends with one line naming it)."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.pathname.startswith(_REPO_PREFIX):
      return True
    if record.exc_info and record.exc_info[1] is not None and storage.os_error_in(record.exc_info[1]):
      return False
    return record.levelno >= logging.WARNING


_REPO_PREFIX = str(CONFIGS_DIR.parent) + os.sep


def quiet_libraries() -> None:
  """Libraries' INFO logging (orbax's, per save and restore) is dropped unless --verbosity was given: a run
  prints its own lines, and the progress bar the rest."""
  handler = absl_logging.get_absl_handler()
  if sys.unraisablehook is sys.__unraisablehook__:
    sys.unraisablehook = _unraisable
  if "verbosity" in flags.FLAGS and flags.FLAGS["verbosity"].present:
    return
  if not any(isinstance(f, _OwnInfoOnly) for f in handler.filters):
    handler.addFilter(_OwnInfoOnly())


def _unraisable(unraisable: Any) -> None:
  """After a failed save, TensorStore's callbacks into orbax's closed event loop fail by the hundred ("Event loop is
  closed", each an ignored exception with its traceback): those are dropped; every other one is shown."""
  if not (isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed"):
    sys.__unraisablehook__(unraisable)


def keep_freed_memory() -> None:
  """Large NumPy temporaries reuse freed heap memory instead of fresh pages (glibc only; else nothing)."""
  # Each fresh mmap'd array page-faults on first touch: 30% of the goodput simulator's CPU time at 2.4M chips.
  try:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-4, 0)  # M_MMAP_MAX: no mmap'd chunks, so freed arrays stay in the heap
    libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD (a C int): do not hand the heap's top back to the kernel
  except (OSError, AttributeError):
    pass


def config_file() -> str:
  """The path of the config file --config named (after flags are parsed)."""
  return config_path(config_flags.get_config_filename(flags.FLAGS["config"]))


def overrides() -> dict[str, Any]:
  """The --config.FIELD=value overrides given on the command line, in order."""
  return dict(config_flags.get_override_values(flags.FLAGS["config"])) if "config" in flags.FLAGS else {}


def typed_text(value: Any, short: bool = False) -> str:
  """A value as --config.FIELD= reads it back exactly; `short`: as a run's name shows it (floats to 6 digits)."""
  if isinstance(value, (tuple, list)):
    single = "," if len(value) == 1 and not short else ""
    return "(" + ",".join(typed_text(v, short) for v in value) + single + ")"
  if isinstance(value, float):
    return f"{value:g}" if short else repr(value)
  return str(value)


def varied(fields: dict[str, Any]) -> str:
  """'outer.quorum=2,inner_steps=10': the fields that make a run differ from its config file, safe as a path."""
  shown = {k: v for k, v in fields.items() if k not in QUIET_FIELDS and k != "mode"}
  text = ",".join(f"{k}={typed_text(v, short=True)}" for k, v in shown.items())
  safe = "".join(c if c.isalnum() or c in "._=,+-()" else "_" for c in text)
  return safe[:120]


def run_name(config: ml_collections.ConfigDict, given: str = "") -> str:
  """The run's name, which is its directory: `given` (--run_name), else its mode. A name finds the run again
  whatever else changes; a usage error names --run_name unless it is a plain directory name."""
  name = given or str(config.get("mode", "decoupled"))
  if name.startswith(".") or any(c in name for c in "/\\\0") or len(name) > 120:
    raise UsageError(f"--run_name={given!r}: allowed a directory name (no '/', not starting with '.', at most 120 "
                     "characters)")
  return name


def integers(flag: str, values: Sequence[str]) -> list[int]:
  """A list flag's values as integers; anything else is a usage error naming the flag (exit 2)."""
  return _parsed(flag, values, int, "integers")


def floats(flag: str, values: Sequence[str]) -> list[float]:
  """A list flag's values as numbers; anything else is a usage error naming the flag (exit 2)."""
  return _parsed(flag, values, float, "numbers")


def _parsed(flag: str, values: Sequence[str], kind: type, what: str) -> list:
  try:
    return [kind(v) for v in values]
  except ValueError:
    fail(f"--{flag}={','.join(values)}: allowed a comma-separated list of {what}")
  raise AssertionError("unreachable")


def choices(flag: str, values: Sequence[str], allowed: Sequence[str]) -> list[str]:
  """A list flag's values, each one of `allowed`; anything else is a usage error naming the flag (exit 2)."""
  for value in values:
    if value not in allowed:
      close = difflib.get_close_matches(value, allowed, n=1)
      fail(f"--{flag}: {value!r} is not allowed: " + (f"did you mean {close[0]!r}? " if close else "") +
           f"allowed a comma-separated list of {list(allowed)}")
  return list(values)


def guarded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
  """`fn(*args, **kwargs)`; a config, data or usage error exits 2, a diverged run or a storage error exits 1, and a
  run stopped by a signal exits 128 + its number, each with one line."""
  try:
    return fn(*args, **kwargs)
  except (ConfigError, DataError, UsageError) as error:
    fail(error)
  except TrainingDiverged as error:
    sys.exit(f"error: {error}")
  except preemption.Interrupted as error:
    print(error, file=sys.stderr, flush=True)
    sys.exit(error.exit_code)
  except Exception as error:  # pylint: disable=broad-except
    cause = storage.os_error_in(error)  # a full disk, an unwritable path (maybe wrapped by orbax): one line, exit 1
    if cause is None:
      raise
    raise storage.StorageFailure(f"error: {storage.describe(cause)}") from None


def launch(job: str, config: ml_collections.ConfigDict, workdir: str | None, *args: Any, **kwargs: Any) -> Any:
  """Validates `config` and `workdir` before JAX starts, then runs `job` ('module:function') guarded."""

  def validated_job() -> Any:
    from_config_dict(config)
    check_workdir(workdir)
    module, _, function = job.partition(":")
    return getattr(importlib.import_module(module), function)(config, workdir, *args, **kwargs)

  with preemption.handling():
    try:
      return guarded(validated_job)
    except storage.StorageFailure as failure:
      print(failure.code, file=sys.stderr, flush=True)
      sys.stdout.flush()
      os._exit(1)  # pylint: disable=protected-access  # (libraries' exit hooks would write into the full disk)

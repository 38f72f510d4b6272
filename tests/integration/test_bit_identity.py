"""Bit-identity guard: virtual-clock runs must reproduce the recorded metrics.jsonl byte for byte.

A refactor never changes these files. A change that alters the numbers on purpose re-records them in
the same commit and says why:

  python -m pytest tests/integration/test_bit_identity.py -m "slow or not slow" --record-golden

XLA:CPU's numerics depend on the CPU's vector instructions and on the jax/jaxlib versions, so byte identity binds
only on the platform the files were recorded on (tests/golden/platform.json). Elsewhere the guard still runs and
compares every record: its kinds, keys, counts, orders, versions, token counts, data ranges and modeled times exactly,
and the numbers XLA computes (losses, norms, learning rates) within a relative tolerance, RTOL. Whatever the platform,
a run repeated in the same session must reproduce its own records byte for byte. The guard never skips (under CI a
skip fails, tests/conftest.py). The smoke run with a crash is in the default suite; the plain smoke run, chaos and
synchronous DiLoCo are marked slow (`python -m pytest -m slow tests/integration/test_bit_identity.py`, ~7 minutes on
2 cores).
Every record's `wall_time` (when it was logged) is never reproducible: it is stripped on both sides, and the
goldens are recorded without it.
"""

import importlib
import json
import math
import os
import pathlib
import platform
import subprocess
import sys
from typing import Any

import jax
import jaxlib
import pytest

from runtime.experiments import modes
from runtime.reporting.metrics import without_wall_time

GOLDEN = pathlib.Path(__file__).parent.parent / "golden"

# name: (mode entry point, config module, overrides, slow). The runs named by the redesign issue.
GUARDED = {
    "smoke": (modes.train, "smoke", {}, True),  # (CI time: smoke_faults, in the default suite, runs the same config)
    "smoke_faults": (modes.train, "smoke", {"clock.speeds": (1.0, 1.1, 1.2, 1.3),
                                            "faults.schedule": "crash:learner=1,time=30"}, False),
    "diloco_sync": (modes.train, "diloco_sync", {"total_steps": 60}, True),
    "chaos": (modes.chaos, "chaos", {}, True),
}


def _platform() -> dict:
  flags = pathlib.Path("/proc/cpuinfo").read_text().split() if pathlib.Path("/proc/cpuinfo").exists() else []
  return {"machine": platform.machine(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
          "vector_isa": sorted({f for f in flags if f in ("avx", "avx2", "fma", "avx512f", "neon", "asimd")})}


def _metrics(workdir: pathlib.Path) -> dict[str, str]:
  """Every run's metrics.jsonl under `workdir`, by run name, without wall times."""
  return {p.parent.name: without_wall_time(p.read_text()) for p in sorted(workdir.glob("*/metrics.jsonl"))}


def _run(name: str, workdir: pathlib.Path) -> dict[str, str]:
  entry, module, overrides, _ = GUARDED[name]
  config = importlib.import_module(f"configs.{module}").get_config()
  for key, value in overrides.items():
    section, _, field = key.rpartition(".")
    (config[section] if section else config)[field] = value
  config.progress = False
  config.tensorboard = False
  entry(config, workdir)
  return _metrics(workdir)


# Another CPU's vector instructions (or another jax/jaxlib) reorder XLA's float32 reductions, which rounds each result
# differently (~1e-7 relative); measured here with XLA limited to AVX (--xla_cpu_max_isa=AVX), the smoke runs' losses
# and norms moved at most 2e-7 relative. 1e-3 leaves that drift four orders of magnitude of room, while a change to
# what a run computes (a batch, a weight, a learning rate step) moves them by far more.
RTOL = 1e-3
# Floats Python derives from the virtual clock, never from XLA's numbers: exact on every platform.
EXACT_FLOATS = ("time",)

_FIRST: dict[str, dict[str, str]] = {}  # each guarded run's records from its first run in this session


def _first_run(name: str, tmp_path_factory) -> dict[str, str]:
  """The run's records, run once per session: the guard and the determinism check share it."""
  if name not in _FIRST:
    _FIRST[name] = _run(name, tmp_path_factory.mktemp(name))
  return _FIRST[name]


def _agree(got: Any, want: Any, key: str = "") -> bool:
  """Whether a record (or one of its values) matches the recorded one: XLA's floats within RTOL, all else exactly."""
  if isinstance(want, dict):
    return isinstance(got, dict) and list(got) == list(want) and all(_agree(got[k], want[k], k) for k in want)
  if isinstance(want, list):
    return isinstance(got, list) and len(got) == len(want) and all(_agree(a, b, key) for a, b in zip(got, want))
  if isinstance(want, float) and type(got) is float and key not in EXACT_FLOATS:
    return math.isclose(got, want, rel_tol=RTOL) or (math.isnan(got) and math.isnan(want))
  return type(got) is type(want) and got == want


def _assert_same(what: str, text: str, want: str, same) -> None:
  """Asserts every record of `text` is `same` as `want`'s, naming the first that is not."""
  got_lines, want_lines = text.splitlines(), want.splitlines()
  first = next((i for i, (a, b) in enumerate(zip(got_lines, want_lines)) if not same(a, b)),
               min(len(got_lines), len(want_lines)))
  assert first == len(got_lines) == len(want_lines), (
      f"{what}: first difference at record {first}:\n"
      f"  got  {got_lines[first] if first < len(got_lines) else '<end>'}\n"
      f"  want {want_lines[first] if first < len(want_lines) else '<end>'}")


def _guard(name: str, runs: dict[str, str]) -> str:
  """Checks runs against their goldens, byte for byte on the recorded platform, else within RTOL; says which."""
  exact = _platform() == json.loads((GOLDEN / "platform.json").read_text())
  expected = {p.stem: without_wall_time(p.read_text()) for p in sorted((GOLDEN / name).glob("*.jsonl"))}
  assert sorted(runs) == sorted(expected)
  for run, text in runs.items():
    if exact:
      _assert_same(f"{name}/{run}", text, expected[run], str.__eq__)
      assert text == expected[run]
    else:
      _assert_same(f"{name}/{run} (within rtol {RTOL}: recorded on another platform)", text, expected[run],
                   lambda a, b: _agree(json.loads(a), json.loads(b)))
  return "exact" if exact else "within RTOL"


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if GUARDED[n][3] else n for n in GUARDED])
def test_virtual_clock_run_reproduces_the_recorded_metrics_byte_for_byte(name, tmp_path_factory, request):
  runs = _first_run(name, tmp_path_factory)
  if request.config.getoption("--record-golden"):
    recorded = GOLDEN / name
    recorded.mkdir(parents=True, exist_ok=True)
    for run, text in runs.items():
      (recorded / f"{run}.jsonl").write_text(text)
    (GOLDEN / "platform.json").write_text(json.dumps(_platform(), indent=1) + "\n")
    return
  _guard(name, runs)


def test_a_virtual_clock_run_repeated_in_one_session_reproduces_its_records_byte_for_byte(tmp_path_factory):
  first = _first_run("smoke", tmp_path_factory)
  again = _run("smoke", tmp_path_factory.mktemp("smoke_again"))
  assert sorted(again) == sorted(first)
  for run, text in again.items():
    _assert_same(f"smoke/{run}, run again", text, first[run], str.__eq__)


def _another_platform(monkeypatch) -> None:
  """The platform probe reports a CPU with other vector instructions than the goldens were recorded on."""
  recorded = json.loads((GOLDEN / "platform.json").read_text())
  monkeypatch.setattr(sys.modules[__name__], "_platform",
                      lambda: dict(recorded, vector_isa=sorted({*recorded["vector_isa"], "avx512f"})))


def test_on_another_platform_the_run_is_still_guarded_within_the_tolerance(monkeypatch, tmp_path_factory):
  _another_platform(monkeypatch)
  assert _guard("smoke", _first_run("smoke", tmp_path_factory)) == "within RTOL"


def _golden_with(change) -> dict[str, str]:
  """The smoke golden's records, each passed through `change` (a function of one record dict)."""
  text = (GOLDEN / "smoke" / "decoupled.jsonl").read_text()
  return {"decoupled": "".join(json.dumps(change(json.loads(line))) + "\n" for line in text.splitlines())}


def _scaled(record: dict, factor: float) -> dict:
  return {k: v * factor if k in ("loss", "eval_loss", "update_norm") else v for k, v in record.items()}


def test_on_another_platform_floats_within_the_tolerance_pass(monkeypatch):
  _another_platform(monkeypatch)
  assert _guard("smoke", _golden_with(lambda r: _scaled(r, 1 + RTOL / 2))) == "within RTOL"


@pytest.mark.parametrize("change", [
    lambda r: _scaled(r, 1 + 2 * RTOL),
    lambda r: dict(r, version=r["version"] + 1),
    lambda r: dict(r, time=r["time"] * (1 + 1e-12)),
    lambda r: dict(r, merged=r["merged"][::-1]) if r["kind"] == "merge" else r,
    lambda r: {k: v for k, v in r.items() if k != "tokens"},
    lambda r: dict(r, tokens=float(r["tokens"])),
], ids=["float beyond rtol", "version", "modeled time", "merge order", "missing field", "int as float"])
def test_on_another_platform_anything_else_that_differs_fails_the_guard(monkeypatch, change):
  _another_platform(monkeypatch)
  with pytest.raises(AssertionError, match="first difference at record 0"):
    _guard("smoke", _golden_with(change))


def test_on_another_platform_a_missing_record_fails_the_guard(monkeypatch):
  _another_platform(monkeypatch)
  runs = {run: "".join(text.splitlines(keepends=True)[:-1]) for run, text in _golden_with(lambda r: r).items()}
  with pytest.raises(AssertionError, match="first difference at record"):
    _guard("smoke", runs)


def test_under_ci_a_skipped_guard_fails(tmp_path):
  (tmp_path / "conftest.py").write_text((pathlib.Path(__file__).parent.parent / "conftest.py").read_text())
  (tmp_path / "test_bit_identity.py").write_text("import pytest\n\ndef test_guard():\n  pytest.skip('no platform')\n")
  def outcome(ci: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": ci} if ci else {})
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    return out.stdout.strip().splitlines()[-1]
  assert "1 failed" in outcome("true") and "1 skipped" in outcome("")

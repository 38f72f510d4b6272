"""Bit-identity guard: virtual-clock runs must reproduce the recorded metrics.jsonl byte for byte.

A refactor never changes these files. A change that alters the numbers on purpose re-records them in
the same commit and says why:

  python -m pytest tests/test_bit_identity.py -m "slow or not slow" --record-golden

XLA:CPU's numerics depend on the CPU's vector instructions and on the jax/jaxlib versions, so the
files only bind on the platform they were recorded on (tests/golden/platform.json); elsewhere the
test is skipped and says why. The smoke runs are in the default suite; chaos and synchronous DiLoCo
are marked slow (`python -m pytest -m slow tests/test_bit_identity.py`, ~6 minutes on 2 cores).
Every record's `wall_time` (when it was logged) is never reproducible: it is stripped on both sides, and the
goldens are recorded without it.
"""

import importlib
import json
import pathlib
import platform

import jax
import jaxlib
import pytest

from runtime.experiments import modes
from runtime.reporting.metrics import without_wall_time

GOLDEN = pathlib.Path(__file__).parent / "golden"

# name: (entry point, config module, overrides, slow). The runs named by the redesign issue.
GUARDED = {
    "smoke": ("train", "smoke", {}, False),
    "smoke_faults": ("train", "smoke", {"clock.speeds": (1.0, 1.1, 1.2, 1.3),
                                        "faults.schedule": "crash:learner=1,time=30"}, False),
    "diloco_sync": ("train", "diloco_sync", {"total_steps": 60}, True),
    "chaos": ("chaos", "chaos", {}, True),
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
  getattr(modes, entry)(config, workdir)
  return _metrics(workdir)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if GUARDED[n][3] else n for n in GUARDED])
def test_virtual_clock_run_reproduces_the_recorded_metrics_byte_for_byte(name, tmp_path, request):
  recorded = GOLDEN / name
  if request.config.getoption("--record-golden"):
    runs = _run(name, tmp_path)
    recorded.mkdir(parents=True, exist_ok=True)
    for run, text in runs.items():
      (recorded / f"{run}.jsonl").write_text(text)
    (GOLDEN / "platform.json").write_text(json.dumps(_platform(), indent=1) + "\n")
    return
  expected_platform = json.loads((GOLDEN / "platform.json").read_text())
  if _platform() != expected_platform:
    pytest.skip(f"recorded on {expected_platform}, this is {_platform()}: re-record on the base revision here")
  runs = _run(name, tmp_path)
  expected = {p.stem: without_wall_time(p.read_text()) for p in sorted(recorded.glob("*.jsonl"))}
  assert sorted(runs) == sorted(expected)
  for run, text in runs.items():
    got, want = text.splitlines(), expected[run].splitlines()
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert text == expected[run], (f"{name}/{run}: first difference at record {first}:\n"
                                   f"  got  {got[first] if first < len(got) else '<end>'}\n"
                                   f"  want {want[first] if first < len(want) else '<end>'}")

"""Whether a learner's part dispatches asynchronously, on one and two simulated CPU devices, with and without the
crash check in every inner step: `python -m launch.bench_dispatch`. The model and H are configs/smoke.py's
(--config.* overrides them). Results: docs/results/accelerator.md.
"""

from absl import flags

from runtime import cli
from runtime.bench import callback_dispatch as bench

_DEFAULTS = bench.DispatchBenchConfig()
_CONFIG = cli.define_config("smoke", "Model and inner steps: a path or a name.")
_DEVICES = flags.DEFINE_list("devices", [str(n) for n in _DEFAULTS.devices], "Devices of the learner's mesh.")
_REPEATS = flags.DEFINE_integer("repeats", _DEFAULTS.repeats, "Parts timed per case.")


def main(argv: list[str]) -> None:
  del argv
  cli.launch("runtime.bench.callback_dispatch:main", _CONFIG.value, None,
             bench.DispatchBenchConfig(tuple(cli.integers("devices", _DEVICES.value)), _REPEATS.value))


if __name__ == "__main__":
  cli.run(main)

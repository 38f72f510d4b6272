"""Times a report's way up and Θ's way down by the copy and the pinned routes: `python -m launch.bench_host_transfers`.

Flags: --params (float32 entries sent: 100M = 400 MB), --repeats. On an accelerator, the learner's device is its first
one; on a CPU-only host, the last simulated device (the host's is the first). Needs about 4 x params x 4 bytes of RAM.
"""

from absl import flags

from runtime import cli
from runtime.bench import host_transfers

_DEFAULTS = host_transfers.HostTransferBenchConfig()
_PARAMS = flags.DEFINE_integer("params", _DEFAULTS.params, "float32 entries of the tree sent each way.")
_REPEATS = flags.DEFINE_integer("repeats", _DEFAULTS.repeats, "Timed runs of each side after one warm-up.")


def main(argv: list[str]) -> None:
  del argv  # Unused: everything comes from flags.
  cli.guarded(lambda: host_transfers.run(host_transfers.HostTransferBenchConfig(params=_PARAMS.value,
                                                                                repeats=_REPEATS.value)))


if __name__ == "__main__":
  cli.run(main)

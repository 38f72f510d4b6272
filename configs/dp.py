"""The synchronous data-parallel baseline: one jitted step over a mesh of all 8 simulated devices.

Command:  python -m launch.train --config=configs/dp.py --workdir=workdirs/dp
Shows:    the SPMD way the paper compares against, on the default model, data and token budget.
Runtime:  about 2-3 minutes on a 2-core laptop.
Expected: eval loss falls from ~6 to about 1.55 nats/byte (1.548 measured).
Results:  docs/results/quality.md
"""

from configs import default


def get_config():
  config = default.get_config()
  # Every device in one data-parallel mesh; the global batch of 32 splits 4 sequences per device.
  config.mode = "dp"
  return config

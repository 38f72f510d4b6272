"""Synchronous DiLoCo: the default's M=4 learners, but every merge waits for all of them (K = M).

Command:  python -m launch.train --config=configs/diloco_sync.py --workdir=workdirs/diloco_sync
Shows:    the DiLoCo base algorithm: a slow or failed learner stalls every merge.
Runtime:  about 3-4 minutes on a 2-core laptop.
Expected: with equal learner speeds, the same eval loss as the default Decoupled run (every merge
          has all 4 learners either way); with --config.clock.speeds='(1,1,1,2)' the fast learners
          idle about half the time.
Results:  docs/results/quality.md
"""

from configs import default


def get_config():
  config = default.fixed_rounds(default.paper_outer_step(default.get_config()))
  # Quorum K = M with no grace window (set by the mode).
  config.mode = "diloco_sync"
  return config

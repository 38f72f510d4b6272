"""Chaos: M=4 learners under random slice crashes, against elastic DP and DP on the same trace.

Command:  python -m launch.chaos --config=configs/chaos.py --workdir=workdirs/chaos
Shows:    one seeded crash trace (each of 4 slices fails on average every 200 modeled seconds and
          is repaired in 40 s; one interruption per chip every 51,200 s × 256 chips) replayed
          against Decoupled DiLoCo, elastic data-parallel and data-parallel without elasticity,
          plus a failure-free Decoupled DiLoCo run; goodput, uptime and eval loss side by side,
          and timeline.png of each learner's state and the merges.
Runtime:  about 10 minutes on a 2-core laptop (four trainings of the default model).
Expected: Decoupled DiLoCo keeps the highest goodput and its eval loss stays within a few percent
          of the failure-free run.
Results:  docs/results/chaos.md
Wall time: add --config.clock.kind=real --config.faults.time_scale=0.2 --config.faults.restart_seconds=6
          --config.faults.reconfig_seconds=1.6 (a step takes ~0.2 s here: the trace and the costs scaled with it),
          real failures in every mode, about 8 minutes.
"""

from configs import default


def get_config():
  config = default.fixed_rounds(default.paper_outer_step(default.get_config()))
  # Shorter rounds lose less work per crash (the paper's H is 24).
  config.inner_steps = 15
  # Each chip fails once per 51,200 modeled seconds; a 256-chip slice once per 200 s.
  config.faults.mtbi_chip_seconds = 51_200.0
  config.faults.chips_per_slice = 256
  config.faults.repair_seconds = 40.0
  # DP without elasticity restarts from a checkpoint every 10 steps; elastic DP reconfigures.
  config.faults.restart_seconds = 30.0
  config.faults.restart_checkpoint_every = 10
  config.faults.reconfig_seconds = 8.0
  config.progress = False
  return config

"""One failure trace, two engines: the goodput simulator's figure beside the runtime's, on the same failures.

Command:  python -m launch.sim_vs_runtime --config=configs/sim_vs_runtime.py --workdir=workdirs/sim_vs_runtime
Shows:    for data-parallel (restarts from checkpoints, one hot spare), elastic data-parallel and Decoupled DiLoCo
          M=2 and M=4 on the same 8 slices (learners of 4 and 2 slices that reconfigure), over 3 seeds: the
          simulator draws the failure trace, the runtime replays it with real JAX programs in virtual time to the
          token budget, and the simulator's goodput on that trace (and its 95% range over 200 traces) is printed
          beside the runtime's.
Runtime:  about 7 minutes on 2 cores (12 runs of a tiny model).
Expected: the simulator-vs-runtime table (every number there comes from this command).
Results:  docs/results/sim_vs_runtime.md
"""

from configs import default


def get_config():
  config = default.fixed_rounds(default.paper_outer_step(default.get_config()))
  config.model.size = "tiny"
  config.model.d_model = 32
  config.model.mlp_dim = 64
  config.model.max_len = 32
  config.data.seq_len = 32
  config.data.batch_size = 48  # 6 sequences per slice and step; a learner of 4 slices splits 24 over any 1-4 of them
  config.data.max_bytes = 2_000_000
  config.inner_steps = 10
  config.total_steps = 200
  config.eval_every = 100
  config.eval_batches = 2
  config.outer.quorum = 1
  config.outer.grace = "none"  # a grace window's wait is not modeled by the simulator (round_wait_s = 0)
  config.faults.mtbi_chip_seconds = 400.0 * 256  # one failure per slice every 400 modeled seconds
  config.faults.chips_per_slice = 256
  config.faults.repair_seconds = 60.0
  config.faults.restart_seconds = 20.0
  config.faults.reconfig_seconds = 5.0
  config.faults.restart_checkpoint_every = 10
  config.faults.learner_recovery = "reconfigure"
  config.progress = False
  config.tensorboard = False
  return config

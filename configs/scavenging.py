"""The scavenging experiment: a base of 4 learners grows to 8 and to 16 for a while on lent slices.

Command:  python -m launch.scavenging --config=configs/scavenging.py --workdir=workdirs/scavenging
Shows:    Decoupled DiLoCo (K=1, H=30, τ=2) with 4 learners, and the same run with 4 or 12 more slices lent from
          modeled second 30 for 150 s (one more learner each, from the current Θ with fresh inner state, fed by
          the data service), at equal tokens, over 3 seeds: modeled time to the budget, time to reach the base
          run's final eval loss, eval loss at equal tokens, goodput. One table, one plot.
Runtime:  about 20 minutes on 2 cores (9 runs of a tiny model in virtual time: the host's speed does not move
          the numbers; --seeds and --growth pick a subset).
Expected: the scavenging table (every number there comes from this command).
Results:  docs/results/scavenging.md
"""

from configs import default


def get_config():
  config = default.fixed_rounds(default.paper_outer_step(default.get_config()))
  config.learners = 4
  config.num_devices = 4  # one device per slice; each growth adds one device per lent slice
  config.data.assignment = "service"  # learners that join and leave take their data from the service
  config.model.size = "tiny"
  config.data.seq_len = 64
  config.model.max_len = 64
  config.data.batch_size = 32  # 8 sequences per learner and step
  config.inner_steps = 30
  config.overlap_steps = 2
  config.total_steps = 300
  config.eval_every = 20
  config.eval_batches = 8
  config.clock.latency_s = 0.5
  config.progress = False
  config.tensorboard = False
  return config

"""The checkpoint benchmark's run: the merge benchmark's 100M-parameter model, small enough a batch for 2 cores.

Command:  python -m launch.bench_checkpoint --repeats=3
Shows:    what saving every learner's and the syncer's state (orbax, asynchronous) costs a real-clock run:
          the controller's blocking time per save against the time between saves, and throughput on / off.
Runtime:  about 12 minutes at --repeats=2; each run trains M=2 learners on one simulated device each.
Results:  docs/results/checkpointing.md
"""

from configs import default


def get_config():
  config = default.fixed_rounds(default.paper_outer_step(default.get_config()))
  config.model.size = "100m"
  config.learners = 2
  config.num_devices = 2
  config.inner_steps = 4
  config.total_steps = 96
  config.data.seq_len = 32
  config.model.max_len = 32
  config.data.batch_size = 4
  config.data.max_bytes = 2_000_000
  config.eval_batches = 1
  return config

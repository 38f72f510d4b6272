"""The paper's heterogeneous-hardware experiment: 8 learners on two hardware classes, three merge policies.

Command:  python -m launch.heterogeneity --config=configs/heterogeneity.py --workdir=workdirs/heterogeneity
Shows:    8 learners whose step times differ by 18% (4 at 1.0×, 4 at 1.18×) plus 10% per-step jitter, at equal
          tokens: K=8 (synchronous), K=1, and K=1 with the adaptive grace window, over 3 seeds; then the
          ablations of K=1 + grace (no token weighting, plain mean instead of RDA, overlap work overwritten,
          no overlap) and α-mixing instead of carrying the overlap work. One table (goodput, busy fraction,
          learners per merge, eval loss mean ± sd), one plot.
Runtime:  about 30 minutes on 2 cores (8 variants × 3 seeds of a tiny model; virtual time, so the host's
          speed does not move the numbers; --variants and --seeds pick a subset).
Expected: the heterogeneity table (every number there comes from this command).
Results:  docs/results/heterogeneity.md
"""

from configs import default


def get_config():
  config = default.fixed_rounds(default.paper_outer_step(default.get_config()))
  config.learners = 8
  config.num_devices = 8
  config.model.size = "tiny"
  config.data.seq_len = 64
  config.model.max_len = 64
  config.data.batch_size = 64  # 8 sequences per learner and step
  config.inner_steps = 10
  config.overlap_steps = 2
  config.total_steps = 300
  config.eval_every = 100
  config.eval_batches = 8
  config.clock.speeds = (1.0,) * 4 + (1.18,) * 4
  config.clock.jitter = 0.1
  config.clock.latency_s = 0.5  # one way; a sync's round trip fits inside the two overlap steps
  config.progress = False
  config.tensorboard = False
  return config

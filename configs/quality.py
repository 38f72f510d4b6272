"""Quality at a longer budget: DiLoCo settings that reach DP's eval loss within 3% on the default corpus.

Command:  python -m launch.compare --config=configs/quality.py --modes=dp,decoupled --workdir=workdirs/quality
Shows:    M=4 learners at 8x the default token budget (2,400 steps, 9,830,400 tokens) with frequent
          plain averaging (H=5, outer SGD lr 1, no momentum), against DP at equal tokens.
Runtime:  about 17 minutes on a 2-core laptop (DP ~8, Decoupled ~9).
Expected: DP 1.079, Decoupled DiLoCo 1.111 nats/byte (+2.97%, one seed; see README). At this tiny
          scale the paper's outer Nesterov step (lr 0.7, momentum 0.9) and H=30 trail by more.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.total_steps = 2400
  config.eval_every = 480
  config.inner_steps = 5
  # Plain averaging: each merge moves Θ by the whole token-weighted RDA of the learners' deltas.
  config.outer.lr = 1.0
  config.outer.momentum = 0.0
  config.outer.nesterov = False
  return config

"""The scaling study: DiLoCo's gap to DP at equal tokens across model sizes and learner counts, 20 tokens/parameter.

Command:  python -m launch.scaling --config=configs/scaling.py --workdir=workdirs/scaling
Shows:    for each size (tiny 0.12M, small 0.43M, medium 1.28M parameters) DP with its inner learning rate tuned
          on a grid, and Decoupled DiLoCo (K=1, equal speeds: every merge holds all M learners, as synchronous
          DiLoCo) for M = 1, 2, 4, 8 with the outer learning rate tuned per M; the table of eval losses and gaps,
          the anchor's gaps beside them (Charles et al. 2025, Table 4), and the plot of gap vs parameters.
Runtime:  see docs/results/scaling.md (hours on 2 cores: the medium size dominates); resumable, and
          --sizes/--outer_lrs/--seeds add to one workdir.
Expected: the table of docs/results/scaling.md (every number there comes from this command).
Results:  docs/results/scaling.md
"""

from configs import default


def get_config():
  config = default.get_config()
  # At equal speeds every K=1 merge holds all M learners: the synchronous DiLoCo run, on the product's code path.
  config.mode = "decoupled"
  # The budget: 20 tokens per parameter (compute-optimal), at a global batch of 8 sequences of 128 bytes.
  config.tokens_per_param = 20.0
  config.data.batch_size = 8
  config.inner_steps = 30
  # The anchor's recipe: QK-LayerNorm, z-loss, AdamW β2 0.99, warmup then cosine decay to 5%, clip 1.0.
  config.model.qk_norm = True
  config.model.z_loss = 1e-4
  config.inner.b2 = 0.99
  config.inner.min_lr_ratio = 0.05
  config.inner.warmup_steps = 100
  # One held-out set for every M and mode: 16 batches of 32 windows (66,048 bytes).
  config.eval_batches = 16
  config.eval_batch_size = 32
  config.eval_every = 1000
  config.progress = False
  config.tensorboard = False
  return config

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
Variants: configs/scaling.py:heterogeneity and configs/scaling.py:chaos are the study's M=4 run at the small size
          (0.43M parameters, global batch 32, outer lr 0.6 and momentum 0.6) under unequal speeds, for
          `launch.heterogeneity --variants=K=M,K=1,K=1+grace`, and under a fault trace, for `launch.chaos`;
          docs/results/scaling.md gives their commands and rows.
"""

from configs import default


VARIANTS = ("heterogeneity", "chaos")


def get_config(variant: str = ""):
  if variant and variant not in VARIANTS:
    raise ValueError(f"variant {variant!r}: allowed '' (the study) or one of {VARIANTS}")
  config = default.fixed_rounds(default.get_config())
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
  return _small_m4(config, variant) if variant else config


def _small_m4(config, variant: str):
  """The study's small M=4 point at half DP's inner lr (+7.2% to DP; its best, at DP's lr, is +6.6%), under
  `variant`'s speeds or faults."""
  config.model.size = "small"
  config.data.batch_size = 32
  config.learners = 4
  config.num_devices = 4
  config.inner.lr = 3e-3
  config.outer.lr = 0.6
  config.outer.momentum = 0.6
  if variant == "heterogeneity":
    # The paper's two hardware classes: two learners 18% slower, 10% jitter per step; overlap hides a sync.
    config.clock.speeds = (1.0, 1.0, 1.18, 1.18)
    config.clock.jitter = 0.1
    config.clock.latency_s = 0.5
    config.overlap_steps = 2
  else:
    # configs/chaos.py's trace: a 256-chip slice fails every 200 modeled seconds on average, repaired in 40 s.
    config.faults.mtbi_chip_seconds = 51_200.0
    config.faults.chips_per_slice = 256
    config.faults.repair_seconds = 40.0
    config.faults.restart_seconds = 30.0
    config.faults.restart_checkpoint_every = 10
    config.faults.reconfig_seconds = 8.0
  return config

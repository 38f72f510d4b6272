"""The cross-region experiment: 8 learners in 4 regions, DP against Decoupled DiLoCo as the bandwidth drops.

Command:  python -m launch.cross_region --config=configs/cross_region.py --workdir=workdirs/cross_region
Shows:    learners round-robin over 4 regions (2 each; the syncer in region 0), each region's inter-region link
          shared by its learners. At each inter-region bandwidth (unlimited, then --bandwidths): DP with an fp32
          all-reduce per step, Decoupled DiLoCo (K=1, H=30, τ=10) with fp32, int4 and top-k 1% + error feedback
          reports (and int4 / top-k Θ down too: *_down), and synchronous DiLoCo without overlap: modeled time to
          the budget, slowdown, busy fraction, cross-region bytes per trained token, eval loss. Then each
          compression over 3 seeds with learner 7 dropping out halfway, at equal tokens. Two tables, one plot of
          slowdown against bandwidth.
Runtime:  about 30 minutes on 2 cores (20m54s measured for the 34 runs without the two *_down variants, which add
          16 runs; a tiny model, 90 steps' worth of tokens, in virtual time; inter-region bandwidths unlimited,
          1e6, 1e5, 5e4, 1e3 B/s). Larger: --config.total_steps=600 --config.model.size=small, more --bandwidths;
          fewer: --variants, --seeds.
Expected: the README's cross-region tables (every number there comes from this command): int4 within 0.1% of
          fp32's loss, but DP/int4 cross-region bytes 23× (reports alone 199×: Θ goes down in fp32); top-k 21% worse.
          With Θ down compressed too (measured with --bandwidths= and the compression variants only, 21 runs, 27 min
          on 2 cores beside CI): int4 both ways 99.3× fewer cross-region bytes than DP at -0.11% loss; top-k both
          ways 1,221× but 34% worse.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.learners = 8
  config.num_devices = 8  # one device per learner
  config.model.size = "tiny"
  config.data.seq_len = 64
  config.model.max_len = 64
  config.data.batch_size = 32  # 4 sequences per learner and step
  config.inner_steps = 30
  config.overlap_steps = 10  # τ: hides a report's trip up, the merge and Θ's trip down behind 10 inner steps
  config.total_steps = 90
  config.eval_every = 30
  config.eval_batches = 8
  config.clock.bandwidth_bytes_per_s = 1e9  # each learner's own link into its region
  config.clock.latency_s = 0.01
  config.links.num_regions = 4
  config.links.inter_region_latency_s = 0.05
  config.compression.topk_fraction = 0.01
  config.progress = False
  config.tensorboard = False
  return config

#!/usr/bin/env bash
# The accelerator checks, as one script (results: docs/results/accelerator.md): run from the repository root on a
# machine with one or more GPUs/TPUs. Writes its logs to ${OUT:-/tmp/device_benchmarks}.
#  1. the syncer stays on the host CPU while the accelerator is the default device (tests/unit/test_syncer.py);
#  2. real-clock Decoupled DiLoCo vs DP vs the learners' round programs by hand, on the accelerator(s),
#     with a 100M-parameter model (one learner per device: M = number of accelerators);
#     then the same with τ=10 overlap steps that keep training until Θ arrives (the sync hidden);
#  3. the syncer's merge of 8 reports of a 100M-parameter model on the host CPU vs a NumPy copy.
set -uo pipefail
out=${OUT:-/tmp/device_benchmarks}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda,cpu}
learners=$(python3 -c "import jax; print(len(jax.devices()))")
echo "accelerators: $learners; $(python3 -c 'import jax; print(jax.__version__, jax.devices())')" | tee "$out/devices.txt"
python3 -m pytest -q -p no:cacheprovider tests/unit/test_syncer.py 2>&1 | tail -5 | tee "$out/syncer_on_host.txt"
time python3 -m launch.benchmark --which=decoupled_vs_dp --repeats=2 --diloco_steps=120 --skip_rounds=1 \
  --hand_rounds=3 --config.learners="$learners" --config.model.size=100m --config.data.batch_size=32 \
  --config.progress=False --config.tensorboard=False 2>&1 | grep -v "^[IW][0-9]" | tee "$out/decoupled_vs_dp.txt"
# The same with the sync hidden behind overlap steps that keep training until Θ arrives (their work carried).
time python3 -m launch.benchmark --which=decoupled_vs_dp --repeats=2 --diloco_steps=120 --skip_rounds=1 \
  --hand_rounds=3 --config.learners="$learners" --config.model.size=100m --config.data.batch_size=32 \
  --config.overlap_steps=10 --config.outer.keep_training=True --config.progress=False \
  --config.tensorboard=False 2>&1 | grep -v "^[IW][0-9]" | tee "$out/decoupled_vs_dp_overlap.txt"
time python3 -m launch.bench_merge --learners=8 --repeats=3 2>&1 | grep -v "^[IW][0-9]" | tee "$out/bench_merge.txt"

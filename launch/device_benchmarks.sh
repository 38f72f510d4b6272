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
# 4. Where a round's time goes: real-clock Decoupled DiLoCo (two parts in flight, τ=10 that keep training) with a
#    jax.profiler trace of 2 rounds of every learner (docs/accelerator.md); the device idle figures from
#    results.json and each sync stage's host seconds from the merge records.
rm -rf "$out/profiled"
python3 -m launch.train --config=default --config.clock.kind=real --config.learners="$learners" \
  --config.model.size=100m --config.data.batch_size=32 --config.total_steps=150 --config.overlap_steps=10 \
  --config.outer.keep_training=True --config.profile_rounds=2 --config.progress=False --config.tensorboard=False \
  --workdir="$out/profiled" 2>&1 | grep -v "^[IW][0-9]" | tail -3
python3 - "$out/profiled" <<'PY' | tee "$out/device_idle.txt"
import json, pathlib, statistics, sys
run = pathlib.Path(sys.argv[1])
result = json.loads((run / "results.json").read_text())
result = result[0] if isinstance(result, list) else result
print({k: result[k] for k in ("device_idle_max", "device_idle_mean", "busy_mean", "tokens_per_wall_s")})
merges = [json.loads(l) for p in run.glob("*/metrics.jsonl") for l in p.read_text().splitlines()]
merges = [m for m in merges if m.get("kind") == "merge"]
for stage in ("host_report_copy_s", "host_merge_s", "host_theta_copy_s", "host_adopt_s"):
  values = [m[stage] for m in merges if m.get(stage) == m.get(stage)]
  print(stage, "median", statistics.median(values) if values else "n/a")
print("trace:", sorted(str(p) for p in run.glob("*/profile/plugins/profile/*/*")))
PY

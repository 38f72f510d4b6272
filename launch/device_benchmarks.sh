#!/usr/bin/env bash
# The accelerator checks, as one script (results: docs/results/accelerator.md and docs/results/scaling.md): run
# from the repository root on a machine with one or more GPUs/TPUs. Writes at most 8 files to ${OUT:-/tmp/device_benchmarks}.
#  0. a report's way up and Θ's way down, 400 MB each, by the copy route and the pinned one (GB/s, median of 5 after a
#     warm-up; launch.bench_host_transfers), in about two minutes;
#  1. the syncer stays on the host CPU while the accelerator is the default device (tests/unit/test_syncer.py);
#  2. the scaling study's largest CPU size (medium, 1.28M parameters, 20 tokens per parameter), DP and M = 1, 2, 4,
#     8 at seeds 0 and 1, the M learners sharing the accelerator(s) (share_devices), within QUALITY_SECONDS;
#  3. real-clock Decoupled DiLoCo vs DP vs the learners' round programs by hand, on the accelerator(s),
#     with a 100M-parameter model (one learner per device: M = number of accelerators);
#     then the same with τ=10 overlap steps that keep training until Θ arrives (the sync hidden);
#  4. the syncer's merge of 8 reports of a 100M-parameter model on the host CPU vs a NumPy copy;
#  5. a profiled real-clock run: the device idle figures, each sync stage's host seconds, and a summary of the
#     trace (busy share of every device stream, the longest named spans).
# SIZE, BATCH, STEPS, MERGE_LEARNERS, TRANSFER_PARAMS and QUALITY (the launch.scaling flags) shrink it for a dry run
# on CPU.
set -uo pipefail
out=${OUT:-/tmp/device_benchmarks}
size=${SIZE:-100m} batch=${BATCH:-32} steps=${STEPS:-120} merge_learners=${MERGE_LEARNERS:-8}
transfer_params=${TRANSFER_PARAMS:-100000000}
quality=${QUALITY:---sizes=medium --batch_sizes=96 --dp_lrs=0.006 --learners=1,2,4,8 --outer_lrs=0.6 \
--outer_momenta=0.6 --inner_lr_factors=1 --seeds=0,1 --parallel=5}
work=$(mktemp -d)
mkdir -p "$out"
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda,cpu} XLA_PYTHON_CLIENT_PREALLOCATE=false
learners=$(python3 -c "import jax; print(len(jax.devices()))")
echo "accelerators: $learners; $(python3 -c 'import jax; print(jax.__version__, jax.devices())')" | tee "$out/checks.txt"
time timeout 150 python3 -m launch.bench_host_transfers --params="$transfer_params" --repeats=5 2>&1 \
  | grep -v "^[IW][0-9]" | tee "$out/host_transfers.txt"
python3 -m pytest -q -p no:cacheprovider tests/unit/test_syncer.py 2>&1 | tail -3 | tee -a "$out/checks.txt"
# 2. The quality study, stopped at QUALITY_SECONDS (each point that finished is kept; the table is built from them).
echo "== scaling: $quality" | tee -a "$out/checks.txt"
start=$SECONDS
timeout "${QUALITY_SECONDS:-240}" python3 -m launch.scaling --config=configs/scaling.py --workdir="$work/scaling" \
  $quality --config.share_devices=True 2>&1 | grep -v "^[IW][0-9]" | tail -5
pkill -f "launch.train .*--workdir=$work/scaling"; sleep 1  # the points still running
echo "scaling ran $((SECONDS - start)) s" | tee -a "$out/checks.txt"
python3 -m launch.scaling --workdir="$work/scaling" --table_only 2>&1 | grep -v "^[IW][0-9]" | tail -3
cat "$work/scaling/scaling.md" 2>/dev/null | tee -a "$out/checks.txt"
(cd "$work" && find scaling -name "*.md" -o -name "*.json" -o -name "*.txt" -o -name "*.png" | grep -v "/model/" \
  | tar -czf "$out/scaling.tgz" -T -)
# 3. Decoupled DiLoCo vs DP vs the learners' programs by hand; then the sync hidden behind overlap steps that keep
#    training until Θ arrives (their work carried).
bench="python3 -m launch.benchmark --which=decoupled_vs_dp --repeats=2 --diloco_steps=$steps --skip_rounds=1
  --hand_rounds=3 --config.learners=$learners --config.model.size=$size --config.data.batch_size=$batch
  --config.progress=False --config.tensorboard=False"
time timeout 150 $bench 2>&1 | grep -v "^[IW][0-9]" | tee "$out/decoupled_vs_dp.txt"
time timeout 150 $bench --config.overlap_steps=10 --config.outer.keep_training=True 2>&1 | grep -v "^[IW][0-9]" \
  | tee -a "$out/decoupled_vs_dp.txt"
time timeout 90 python3 -m launch.bench_merge --learners="$merge_learners" --repeats=3 2>&1 | grep -v "^[IW][0-9]" \
  | tee "$out/bench_merge.txt"
# 5. Where a round's time goes: real-clock Decoupled DiLoCo (two parts in flight, τ=10 that keep training) with a
#    jax.profiler trace of 2 rounds of every learner (docs/accelerator.md); the device idle figures from
#    results.json, each sync stage's host seconds from the merge records, and the trace's busy shares.
timeout 120 python3 -m launch.train --config=default --config.clock.kind=real --config.learners="$learners" \
  --config.model.size="$size" --config.data.batch_size="$batch" --config.total_steps=150 --config.overlap_steps=10 \
  --config.outer.keep_training=True --config.profile_rounds=2 --config.progress=False --config.tensorboard=False \
  --workdir="$work/profiled" 2>&1 | grep -v "^[IW][0-9]" | tail -2
python3 - "$work/profiled" <<'PY' | tee "$out/device_idle.txt"
import collections, gzip, json, pathlib, statistics, sys
run = pathlib.Path(sys.argv[1])
result = json.loads((run / "results.json").read_text())
result = result[0] if isinstance(result, list) else result
print({k: result[k] for k in ("device_idle_max", "device_idle_mean", "busy_mean", "tokens_per_wall_s")})
merges = [json.loads(l) for p in run.glob("*/metrics.jsonl") for l in p.read_text().splitlines()]
merges = [m for m in merges if m.get("kind") == "merge"]
for stage in ("host_report_copy_s", "host_merge_s", "host_theta_copy_s", "host_adopt_s"):
  values = [m[stage] for m in merges if m.get(stage) == m.get(stage)]
  print(stage, "median", statistics.median(values) if values else "n/a")
for trace in sorted(run.glob("*/profile/plugins/profile/*/perfetto_trace.json.gz")):
  events = json.load(gzip.open(trace))["traceEvents"]
  process = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
  thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
  spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
  begin, end = min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)
  print(f"trace {trace.parent.name}: {len(spans)} spans over {(end - begin) / 1e3:.1f} ms")
  by_line = collections.defaultdict(list)
  for e in spans:
    by_line[(process.get(e["pid"], e["pid"]), thread.get((e["pid"], e.get("tid")), e.get("tid")))].append(e)
  for (proc, line), line_spans in sorted(by_line.items(), key=lambda kv: str(kv[0])):
    if not str(proc).startswith("/device"):
      continue
    busy, reach = 0.0, begin  # the union of the line's spans
    for e in sorted(line_spans, key=lambda e: e["ts"]):
      busy += max(0.0, e["ts"] + e["dur"] - max(e["ts"], reach))
      reach = max(reach, e["ts"] + e["dur"])
    print(f"  {proc} / {line}: busy {busy / (end - begin):.3f} of the trace ({len(line_spans)} spans)")
  named = collections.Counter()
  for e in spans:
    if "/" in e["name"] and e["name"].split("/")[0] in ("controller", "syncer") or e["name"].startswith("learner"):
      named[e["name"]] += e["dur"] / 1e3
  for name, ms in named.most_common(12):
    print(f"  {name}: {ms:.1f} ms")
PY
rm -rf "$work"

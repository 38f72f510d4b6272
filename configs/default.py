"""The embedded default: Decoupled DiLoCo, M=4 learners (2 simulated CPU devices each), K=1 with the grace window,
rounds that end at the syncs' deadlines and τ=4 overlap steps (docs/results/asynchrony.md).

Command:  python -m launch.train --config=configs/default.py --workdir=workdirs/default
Shows:    the single controller running 4 asynchronous learners on the standard library's own
          sources, merging with token-weighted RDA and outer Nesterov, in reproducible virtual time.
Runtime:  about 2-4 minutes on a 2-core laptop (2m00s measured, host shared with another run).
Expected: eval loss of Θ falls from ~5.5 nats/byte (uniform) to about 1.78 (1.778 measured; 1.755 with
          default.fixed_rounds, the rounds of H steps without overlap used before); summary table, metrics.jsonl,
          TensorBoard events and loss.png in workdir.
Results:  docs/results/quality.md
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # Training mode: "decoupled" (Decoupled DiLoCo), "diloco_sync" (K = M), "dp" (data-parallel), or DP under
  # faults: "dp_elastic" (drops a failed slice) and "dp_restart" (restarts from its last checkpoint).
  config.mode = "decoupled"
  # Seed for parameters, data order, jitter and faults: one seed, one run.
  config.seed = 0
  # Simulated CPU devices the controller owns (ignored on real accelerators).
  config.num_devices = 8
  # JAX backend: "local" (this process's devices), "pathways" (runs pathwaysutils.initialize() first: the
  # Pathways proxy backend, with JAX_PLATFORMS=proxy; needs the `pathways` extra) or "ray" (each learner in a Ray
  # actor of its own; needs the `ray` extra). See docs/multislice.md.
  config.backend = "local"
  config.ray = ml_collections.ConfigDict()
  # backend "ray" (each learner in a Ray actor; the `ray` extra): "" starts a local cluster for the run unless one
  # is running in the process; "auto" or "host:port" joins a running cluster (`ray start --head` on its first host).
  config.ray.address = ""
  # M: independent learners, slices_per_learner slices each.
  config.learners = 4
  # Slices to cut the devices into; 0 means slices_per_learner per learner, more leaves spare slices.
  config.slices = 0
  # k: slices per learner; a learner's round runs data-parallel over its k slices (a ('slice', 'data') mesh: batch
  # split over both, parameters replicated across slices). When one fails the learner reconfigures or restarts, by
  # faults.learner_recovery. Modes decoupled and diloco_sync, no capacity.schedule; 1 = one slice each.
  config.slices_per_learner = 1
  # With fewer devices than slices (M learners on one accelerator, or num_devices < learners on CPU), give each
  # slice one device, round-robin: learners on one device take turns, so it runs a quality study, not a speedup.
  # The virtual clock's numbers are those of separate devices. Modes decoupled and diloco_sync (dp ignores it;
  # dp_elastic and dp_restart refuse it).
  config.share_devices = False
  # H: inner steps between a learner's reports.
  config.inner_steps = 30
  # τ: inner steps a learner keeps training while its report is merged (0 = wait for Θ). 4 hides a sync and lets
  # one merge gather the reports of a deadline (docs/results/asynchrony.md).
  config.overlap_steps = 4
  # How long a learner's round is (runtime/diloco/round_plan.py): "steps" = H inner steps for every learner;
  # "time" = until the syncs' deadlines, one every H × the slowest learner's step time (configured under the
  # virtual clock, measured under the real one): a fast learner takes more steps, a rejoining one a shorter round, and
  # the reports of a deadline arrive together. "time" needs fragments = 1 and no capacity.schedule.
  config.rounds = ml_collections.ConfigDict()
  config.rounds.length = "time"
  # Device programs a learner keeps queued on its slices: 2 enqueues its next part before the current one finishes
  # (its device never waits for the controller: docs/accelerator.md), 1 dispatches it once the previous one is
  # handled. 0 = 2 under the real clock and 1 under the virtual one (whose recorded runs keep their numbers); 1
  # wherever a learner has several slices or faults are injected.
  config.parts_in_flight = 0
  # Rounds of every learner to trace with jax.profiler into <run>/profile/ (TensorBoard's profile plugin or Perfetto;
  # docs/accelerator.md); 0 = no trace. Modes decoupled and diloco_sync.
  config.profile_rounds = 0
  # P: Streaming DiLoCo fragments (modes decoupled, diloco_sync). P > 1: a learner reports every H/P inner steps, each
  # report carrying one of P balanced groups of tensors in turn (each fragment syncs every H steps, staggered by H/P),
  # merged with that fragment's own quorum, grace window and outer momentum; τ < H/P. 1 = the whole model each H.
  config.fragments = 1
  # Token budget in inner steps at the full global batch (the same budget in every mode).
  config.total_steps = 300
  # Or the budget in tokens per model parameter (0 = total_steps above): total_steps becomes the steps at the global
  # batch (whole rounds of inner_steps) nearest tokens_per_param × the model's parameters (20: compute-optimal).
  config.tokens_per_param = 0.0
  # Evaluate Θ every this many steps' worth of merged tokens.
  config.eval_every = 60
  # Held-out batches per evaluation.
  config.eval_batches = 8
  # Sequences per held-out batch (0 = data.batch_size / learners: then runs with different learners see different
  # held-out sets; set it to compare them on one).
  config.eval_batch_size = 0
  # DP: pull train metrics every this many steps.
  config.log_every = 10
  # Shard parameters along each slice's data axis (FSDP) instead of replicating them.
  config.fsdp = False
  config.mesh = ml_collections.ConfigDict()
  # Tensor-parallel width inside a slice (DP: across every device): each parameter's heads, MLP or vocabulary axis
  # is split across it (models/lm.py); the slice's other devices split the batch (and, with fsdp, the state).
  config.mesh.tensor = 1
  config.syncer = ml_collections.ConfigDict()
  # Host CPU devices the syncer splits Θ's tensors across (its momentum, history, mirrors and merge with them); each
  # shard merges its share in parallel, to the same bits as one. Under Pathways, the CPU hosts; simulated, CPU devices.
  config.syncer.shards = 1
  # Show a progress bar (tokens, loss, tokens per second) on stderr.
  config.progress = True
  # Write TensorBoard event files under <workdir>/<run>/tb (view: tensorboard --logdir <workdir>).
  config.tensorboard = True
  # Persistent XLA compilation cache shared by learners, modes and reruns ("" turns it off).
  config.compile_cache = "~/.cache/decoupled-diloco/xla"
  # Save a checkpoint (orbax, asynchronous, verified) every this many steps (dp) or merges (decoupled,
  # diloco_sync); 0 = none. A killed run resumes from its newest sound one when run again with the same workdir.
  config.checkpoint_every = 0
  # decoupled, diloco_sync: also save at the first merge this many seconds of the run's clock (modeled under the
  # virtual clock, wall under the real one) after the last checkpoint; 0 = by checkpoint_every only.
  config.checkpoint_seconds = 0.0
  # Also save at the first merge (dp: step) this many wall seconds (the host's clock, whatever the run's) after the
  # last checkpoint, and a final one at the end, so that the same command resumes a killed run. 0 = none (with the
  # two above 0 too: no checkpoints). Saves run off the training path (docs/results/checkpointing.md).
  config.checkpoint_wall_seconds = 120.0
  # Newest checkpoints kept.
  config.checkpoint_keep = 3
  # decoupled, diloco_sync: save each learner's inner state (parameters, AdamW moments, its round in flight) in
  # checkpoints. False: Θ, the outer optimizer and the run's bookkeeping only, and a resumed run restarts every
  # learner from Θ, writing off the work it had not merged (docs/checkpoints.md). dp saves its model's whole state.
  config.checkpoint_learner_state = True
  # Run again in a workdir that holds this run: resume from its newest sound checkpoint (a different config is
  # refused, naming the fields). False: start afresh in a new run directory beside it; nothing is deleted.
  config.resume = True
  # Every run ends by saving its model to <run>/model/ (runtime.load_model, launch.sample, launch.evaluate);
  # decoupled, diloco_sync: also every this many merges, to <run>/models/merge-<N>/ (0 = only at the end).
  config.save_model_every = 0

  config.model = ml_collections.ConfigDict()
  # The architecture: "gpt" (LayerNorm, GELU MLP, multi-head attention, tied embedding), "llama" (RMSNorm, SwiGLU,
  # grouped-query attention, rotary), or a user's model as 'package.module:attribute' naming a ModelSpec
  # (docs/model.md; `python -m launch.models` lists the sizes and their parameters).
  config.model.kind = "gpt"
  # A named size (tiny 0.12M parameters, small 0.43M, medium 1.28M, base 3.2M, 100m); fields set below override it.
  config.model.size = "small"
  # Positions: "rotary" or "learned".
  config.model.positions = "rotary"
  # Longest sequence the model accepts.
  config.model.max_len = 128
  # Transformer blocks (None = from model.size).
  config.model.num_layers = ml_collections.config_dict.placeholder(int)
  # Residual stream width (None = from model.size).
  config.model.d_model = ml_collections.config_dict.placeholder(int)
  # Attention heads; d_model / num_heads must be even (None = from model.size).
  config.model.num_heads = ml_collections.config_dict.placeholder(int)
  # llama: key/value heads, each shared by num_heads / num_kv_heads query heads (None = from model.size; 0 = one per
  # query head).
  config.model.num_kv_heads = ml_collections.config_dict.placeholder(int)
  # llama: False gives the output projection its own matrix (gpt's is always the embedding's transpose).
  config.model.tied_embeddings = ml_collections.config_dict.placeholder(bool)
  # Hidden width of each MLP block (None = from model.size).
  config.model.mlp_dim = ml_collections.config_dict.placeholder(int)
  # Activation dtype: "float32" or "bfloat16" (parameters stay float32).
  config.model.dtype = "float32"
  # Recompute each block's activations in the backward pass instead of keeping them (less memory, more compute).
  config.model.remat = False
  # QK-LayerNorm: each head's queries and keys are layer-normed before their dot product (bounded attention logits).
  config.model.qk_norm = False
  # z-loss: training adds z_loss × mean (log Z)² (Z: the softmax normalizer at each position; 1e-4 in the scaling-law
  # recipe); evaluations report the plain cross-entropy. 0 = off.
  config.model.z_loss = 0.0
  # Token ids (None = from the data: 256 for text read byte-level, a prepared dataset's manifest otherwise).
  config.model.vocab_size = ml_collections.config_dict.placeholder(int)

  config.data = ml_collections.ConfigDict()
  # "stdlib" (the Python standard library's .py files), a file, directory or glob of text (read byte-level), or
  # a directory written by launch.prepare_data (tokenized shards streamed from disk; docs/data.md).
  config.data.path = "stdlib"
  # Fraction of files held out for evaluation (chosen by a stable hash of each path); a prepared dataset
  # has its own evaluation split.
  config.data.eval_fraction = 0.02
  # Read at most this many bytes of the corpus (None = all); of a prepared dataset, of its training tokens.
  config.data.max_bytes = ml_collections.config_dict.placeholder(int)
  # Tokens (bytes) per training sequence.
  config.data.seq_len = 128
  # Global batch: summed over learners (each gets batch_size / learners).
  config.data.batch_size = 32
  # How the stream is cut into one shard per learner: "strided" (each shard samples the whole
  # corpus) or "contiguous" (each shard is a span of whole files: non-IID learners).
  config.data.shard_layout = "strided"
  # How learners get their data: "shards" (learner m trains on shard m of M, cut as above) or "service"
  # (the controller leases windows of one global stream on demand, independent of M: learners may join and
  # leave without skipping or repeating a window; needed by capacity.schedule).
  config.data.assignment = "shards"
  # Per-learner batch sizes (empty = batch_size / learners each), e.g. smaller on a slower hardware class;
  # they must sum to batch_size. Token weighting gives larger batches more weight in merges.
  config.data.learner_batches = ()
  # Batches prepared ahead in a background thread.
  config.data.prefetch = 4

  config.inner = ml_collections.ConfigDict()
  # Inner AdamW peak learning rate.
  config.inner.lr = 3e-3
  # Steps of linear warmup from 0 to inner.lr.
  config.inner.warmup_steps = 20
  # Cosine decay ends at this fraction of inner.lr.
  config.inner.min_lr_ratio = 0.1
  # AdamW decoupled weight decay.
  config.inner.weight_decay = 0.1
  # AdamW first- and second-moment decay rates.
  config.inner.b1 = 0.9
  config.inner.b2 = 0.95
  # Clip each inner step's gradient to this global norm.
  config.inner.grad_clip = 1.0
  # Where a DiLoCo learner's warmup and decay stand: "learner" (its own inner steps) or "run" (the run's
  # progress in global batches of tokens, set at each dispatch: learners that join late, or more learners than
  # the base, follow the run's schedule rather than each their own).
  config.inner.schedule_progress = "learner"

  config.outer = ml_collections.ConfigDict()
  # Outer SGD learning rate on the merged outer gradient. 0.6 with momentum 0.6: the best found for M=2 and M=4 by
  # the scaling study (docs/results/scaling.md); the paper's 0.7 / 0.9 is paper_outer_step below.
  config.outer.lr = 0.6
  # Outer momentum, and whether it is Nesterov momentum.
  config.outer.momentum = 0.6
  config.outer.nesterov = True
  # How a merge's outer gradient moves Θ (runtime/diloco/sync/outer_rules.py; a merge of n of M learners is n/M of a
  # round): "nesterov", one momentum step per merge whatever its share; "delayed_nesterov", a plain step per merge,
  # the momentum stepping once per round's worth of merges on their sum (Liu et al. 2024); "momentum_per_round", the
  # momentum decaying by outer.momentum^(n/M) at each merge, so by outer.momentum per M reports merged.
  config.outer.rule = "nesterov"
  # A diagnostic (docs/results/asynchrony.md): a merge of n reports goes through outer.rule as n merges of one,
  # each 1/M of a round, all measured from the Θ the merge began with (K=M then shows what partial merges cost the
  # rule without any staleness). False: the reports are merged, then take one step.
  config.outer.merge_one_by_one = False
  # K: merge as soon as this many learners have reported.
  config.outer.quorum = 1
  # Per-tensor merge: "rda" (radial-directional averaging) or "mean".
  config.outer.merge = "rda"
  # Embeddings use the plain weighted mean even under RDA.
  config.outer.embed_mean = True
  # Weight learners by tokens × tokens/steps; False weighs them equally.
  config.outer.token_weighting = True
  # Outer gradient against the syncer's "current" Θ or the learner's "base" Θ.
  config.outer.outer_grad_base = "current"
  # "fraction": a merge of n of M learners is n/M of an outer step (keeps K=1 merges stable under
  # Nesterov momentum); "none": every merge is a full outer step.
  config.outer.scale = "fraction"
  # Grace window after quorum: "none", "adaptive" (uses the overlap slack) or "fixed".
  config.outer.grace = "adaptive"
  # Adaptive grace: the fraction (0-1) of the learners' measured slack the syncer may wait.
  config.outer.grace_gamma = 1.0
  # Fixed grace: modeled seconds the syncer waits after quorum for more reports.
  config.outer.grace_seconds = 0.0
  # Decay of the moving averages behind the adaptive grace window.
  config.outer.ema_decay = 0.9
  # What a learner does with its τ overlap steps when Θ arrives: "carry" (θ ← Θ + the overlap progress;
  # reaches Θ in its next report), "mix" (θ ← (1−mix_alpha)·Θ + mix_alpha·θ, Streaming DiLoCo), or
  # "overwrite" (θ ← Θ; the overlap steps' data is trained again).
  config.outer.receive = "carry"
  # outer.receive == "mix": the weight α of the learner's own parameters.
  config.outer.mix_alpha = 0.5
  # A learner that has finished its overlap steps and still has no Θ keeps training (τ more steps at a time).
  config.outer.keep_training = False
  # A report whose delta norm is above quarantine_factor × the recent norm is quarantined, never merged.
  config.outer.quarantine_factor = 100.0
  # A report whose delta norm is non-finite or above this is quarantined too.
  config.outer.max_delta_norm = 1e6
  # An outer step whose norm exceeds max_update_ratio × the merged deltas' norm is never committed.
  config.outer.max_update_ratio = 100.0
  # This many merges in a row that commit nothing stop the run with a message (it diverged).
  config.outer.divergence_merges = 8

  config.clock = ml_collections.ConfigDict()
  # "virtual": seeded discrete-event time (reproducible); "real": wall time.
  config.clock.kind = "virtual"
  # Modeled seconds per inner step at speed 1.
  config.clock.step_seconds = 1.0
  # Per-learner slowdown factors, e.g. (1, 1, 1, 2) (empty = all 1).
  config.clock.speeds = ()
  # Relative standard deviation of each round's step time (modeled noise).
  config.clock.jitter = 0.0
  # Learner <-> syncer link bandwidth, bytes per modeled second each way.
  config.clock.bandwidth_bytes_per_s = 1e9
  # Learner <-> syncer link latency, modeled seconds.
  config.clock.latency_s = 0.0
  # The syncer's cost of one merge, modeled seconds.
  config.clock.merge_seconds = 0.0

  config.links = ml_collections.ConfigDict()
  # Regions: learner m sits in region m mod num_regions (the syncer in region 0); 1 = everyone in one region.
  config.links.num_regions = 1
  # Or each learner's region, e.g. (0, 0, 1, 1) (empty = round-robin over num_regions).
  config.links.regions = ()
  # Each region's link to the others, bytes per modeled second each way, shared by its learners (transfers on it
  # queue); a learner outside region 0 reaches the syncer over its own link (clock.*) and this one.
  config.links.inter_region_bandwidth_bytes_per_s = 1e9
  # Latency of the inter-region link, modeled seconds.
  config.links.inter_region_latency_s = 0.0
  # The link model's per-merge records and DP's gradient all-reduce time even in one region (on anyway with
  # more than one region; off by default, so that recorded runs keep their numbers).
  config.links.enabled = False

  config.faults = ml_collections.ConfigDict()
  # Scheduled faults, ';'-separated: crash (time= or step=, repair=, slice=J: only the J-th slice of a learner of
  # several; without it every slice of the learner fails), straggler (duration=, factor=), corrupt (how=nan|inf|huge,
  # or flip|truncate a compressed report's bytes), link (duration=, mode=delay|drop), bug (a program error from time=
  # on: stops the learner for good); every one names learner= and time=.
  config.faults.schedule = ""
  # Random crashes: per-chip mean time between interruptions, seconds of the run's clock (modeled or wall; 0 = none).
  config.faults.mtbi_chip_seconds = 0.0
  # A recorded failure trace to replay instead of random crashes: the JSON of `python -m launch.simulate
  # --trace=PATH` (per slice: when it failed and when its repair ended); the run's slices beyond the trace's are
  # spares that never fail. "" = none.
  config.faults.trace = ""
  # Seconds of the run's clock per second of a random or replayed crash trace (its failure and repair times): 1e-4
  # replays a year-scale trace in under an hour of wall time under clock.kind='real'. 1 = as drawn.
  config.faults.time_scale = 1.0
  # Chips per slice: a slice fails chips_per_slice times as often as one chip.
  config.faults.chips_per_slice = 256
  # A crashed slice is repaired after this many seconds (modeled, or wall under clock.kind='real').
  config.faults.repair_seconds = 60.0
  # A spare slice (slices > learners) takes over a crashed learner after this many modeled seconds.
  config.faults.spare_swap_seconds = 5.0
  # A learner whose report was lost pulls Θ after this long and trains that data again.
  config.faults.report_timeout_seconds = 30.0
  # Data-parallel without elasticity (dp_restart): modeled seconds to restart after a crash.
  config.faults.restart_seconds = 30.0
  # dp_restart: steps between the checkpoints it restarts from (a crash loses the steps since the last one); not
  # checkpoint_every above, the checkpoints a killed run resumes from.
  config.faults.restart_checkpoint_every = 10
  # Modeled seconds to reconfigure around a lost slice, and again to re-add it: elastic data-parallel (dp_elastic),
  # and a learner of several slices with learner_recovery = "reconfigure".
  config.faults.reconfig_seconds = 8.0
  # A learner of several slices (slices_per_learner > 1) that loses one, as the goodput simulator's option of the
  # same name (configs/goodput.py): "reconfigure" (it keeps its state, loses only the part in flight, pays
  # reconfig_seconds and trains on the slices left; it grows back, paying reconfig_seconds again, when the slice is
  # repaired or a spare is free) or "restart" (it goes down, its unmerged work is written off, and it comes back
  # from the current Θ with fresh inner state once it has k slices: a spare after spare_swap_seconds, or the
  # repaired one). A learner of one slice always restarts.
  config.faults.learner_recovery = "reconfigure"

  config.capacity = ml_collections.ConfigDict()
  # Slices lent for a while (scavenging), ';'-separated, seconds of the run's clock (modeled or wall):
  # "lend:slices=4,time=100,duration=300" lends 4 slices at t=100 for 300 s; "random:slices=4,gap=200,duration=300"
  # is a seeded availability trace (absent for an exponential gap of mean 200 s, then lent for an exponential
  # duration of mean 300 s, again and again). Each lent slice runs one more learner (current Θ, fresh inner state) until it is reclaimed; the
  # devices are shared among learners + lent slices (num_devices must divide). Needs data.assignment='service'.
  config.capacity.schedule = ""

  config.compression = ml_collections.ConfigDict()
  # Reports learner -> syncer: "none" (θ_m whole, fp32), or the outer gradient Δ_m = Θ − θ_m quantized on the
  # learner's slice and dequantized on the syncer's CPU: "bf16", "int8"/"int4" (block-wise scales), "topk" (the
  # largest values and their indices). Not with checkpoints yet.
  config.compression.up = "none"
  # Θ syncer -> learner: "none" (whole, fp32), or "bf16"/"int8"/"int4"/"topk": Θ − Θ̃_m compressed on the syncer,
  # where Θ̃_m mirrors what learner m holds (both sides add the same decoded update, so the error is fed back). A
  # rejoining or reset learner gets Θ whole. Not with checkpoints yet.
  config.compression.down = "none"
  # int8/int4 (and top-k's int values): values per fp32 scale.
  config.compression.block_size = 256
  # topk: each tensor sends ceil(topk_fraction × its size) values, the largest in magnitude.
  config.compression.topk_fraction = 0.01
  # topk: the format of the values sent (fp32, bf16, int8, int4).
  config.compression.topk_values = "bf16"
  # Error feedback: what a lossy codec did not send stays on the learner and joins its next outer gradient
  # (dropped when its work never reaches Θ: a restart, a quarantined or a lost report).
  config.compression.error_feedback = True
  return config


def paper_outer_step(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with the paper's outer step (Nesterov, lr 0.7, momentum 0.9): the default until the scaling study, and
  the setting of every recorded result measured before it (their configs call this so that their numbers stand)."""
  config.outer.update(lr=0.7, momentum=0.9)
  return config


def fixed_rounds(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with rounds of H inner steps and no overlap (rounds.length "steps", τ = 0): the default until the
  asynchrony study (docs/results/asynchrony.md), and the setting of every recorded result measured before it (their
  configs call this so that their numbers stand; one that sets τ itself sets it after)."""
  config.rounds.update(length="steps")
  config.update(overlap_steps=0)
  return config

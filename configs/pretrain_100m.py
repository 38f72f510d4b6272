"""Pre-training the 100m model on a prepared dataset: the starting point on real chips (not run in CI).

Command:  python -m launch.prepare_data --input=CORPUS --output=DATA --tokenizer=sentencepiece --vocab_size=32768 \
            --workers=16
          python -m launch.train --config=pretrain_100m:DATA --workdir=workdirs/pretrain
Shows:    4 learners of the 100m model (12 layers, d_model 768, 512 tokens of context) with bfloat16 activations,
          a 32k-token vocabulary read from DATA's manifest, the real clock, overlap steps that keep training while
          a merge is under way, and checkpoints every 10 merges (every 30 minutes at most).
          --config.model.remat=True trades compute for activation memory (longer sequences or larger batches);
          --config.num_devices must be the devices the learners' slices are made of.
Runtime:  on CPU only a one-step compile is checked (tests/unit/test_pretrain_config.py); on chips, hours.
Expected: eval loss falls well below ln(32768) = 10.4 within the first thousand steps.
Results:  docs/results/data.md (the loader's speed); docs/data.md (how to prepare DATA)
"""

from configs import default


def get_config(data_path: str = "workdirs/data/pretrain"):
  config = default.fixed_rounds(default.get_config())
  config.data.path = data_path  # a directory written by launch.prepare_data; its manifest sets model.vocab_size
  config.model.size = "100m"
  config.model.max_len = 512
  config.model.dtype = "bfloat16"
  config.data.seq_len = 512
  config.data.batch_size = 128  # 32 sequences (16k tokens) per learner per step
  config.inner_steps = 100
  config.overlap_steps = 10
  config.total_steps = 20_000
  config.inner.lr = 6e-4
  config.inner.warmup_steps = 500
  config.outer.quorum = 2
  config.clock.kind = "real"
  config.eval_every = 500
  config.eval_batches = 16
  config.log_every = 50
  config.checkpoint_every = 10
  config.checkpoint_seconds = 1800.0
  return config

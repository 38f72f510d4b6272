"""Sampling with a KV cache against recomputing the window per token (runtime/trained/sampling.py), side by side:
tokens per second after compiling (the median of `repeats`), their ratio, and how far the greedy outputs agree."""

import dataclasses
import statistics

import jax

from models import lm
from runtime.config.run import RunConfig
from runtime.data import tokenizers
from runtime.trained import sampling, saved


@dataclasses.dataclass(frozen=True)
class SamplingBenchConfig:
  model: str = ""  # a model or run directory; "" = the config's model, initialized from its seed
  prompt: str = "def "
  tokens: int = 256
  repeats: int = 3


def run(run_config: RunConfig, bench: SamplingBenchConfig) -> dict:
  """The measured row: each path's tokens/s, the speed-up, and the greedy outputs' common prefix."""
  if bench.model:
    cfg, params, tokenizer = saved.load_model(bench.model)
  else:
    cfg, tokenizer = run_config.model, tokenizers.of_data(run_config.data.path)[0]
    params = jax.device_get(lm.init_params(cfg, jax.random.key(run_config.seed)))
  rates, outputs = {}, {}
  for name, cache in (("window", False), ("cache", True)):
    runs = [sampling.generate(cfg, params, tokenizer, bench.prompt, tokens=bench.tokens, temperature=0.0,
                              stop_at_end=False, cache=cache) for _ in range(bench.repeats)]
    rates[name] = statistics.median(r["tokens_per_second"] for r in runs)
    outputs[name] = runs[0]["ids"]
  window, cached = outputs["window"], outputs["cache"]
  common = next((i for i, (a, b) in enumerate(zip(window, cached)) if a != b), min(len(window), len(cached)))
  prompt_tokens = len(tokenizer.encode([bench.prompt.encode("utf-8")])[0]) or 1
  fits = cfg.max_len - prompt_tokens + 1  # tokens before the window first slides
  return dict(model=bench.model or f"{cfg.kind} (initialized)", params=cfg.num_params(), max_len=cfg.max_len,
              tokens=bench.tokens, window_tokens_per_s=rates["window"], cache_tokens_per_s=rates["cache"],
              speedup=rates["cache"] / rates["window"], identical_prefix=common, tokens_in_first_window=fits,
              identical_in_first_window=window[:fits] == cached[:fits])

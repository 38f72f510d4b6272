"""Sampling's speed with a KV cache against the window recomputed per token:
`python -m launch.bench_sampling --model=WORKDIR/RUN/model` (default: the default config's model, initialized).

Greedy, --tokens new tokens after --prompt, each path timed after compiling (median of --repeats). Prints tokens/s
of each, the speed-up, and how many leading tokens the two greedy outputs share. Results: docs/model.md.
"""

from absl import flags

from runtime import cli
from runtime.bench import sampling as bench

_DEFAULTS = bench.SamplingBenchConfig()
_CONFIG = cli.define_config("default", "The model to initialize when --model is not given.")
_MODEL = flags.DEFINE_string("model", _DEFAULTS.model, "A model or run directory ('' = the config's, initialized).")
_PROMPT = flags.DEFINE_string("prompt", _DEFAULTS.prompt, "Text to continue.")
_TOKENS = flags.DEFINE_integer("tokens", _DEFAULTS.tokens, "New tokens per generation.")
_REPEATS = flags.DEFINE_integer("repeats", _DEFAULTS.repeats, "Timed generations per path (the median is kept).")


def main(argv: list[str]) -> None:
  del argv

  def measure() -> dict:
    from runtime.config.run import from_config_dict  # pylint: disable=import-outside-toplevel
    return bench.run(from_config_dict(_CONFIG.value), bench.SamplingBenchConfig(
        model=_MODEL.value, prompt=_PROMPT.value, tokens=_TOKENS.value, repeats=_REPEATS.value))

  row = cli.guarded(measure)
  print(f"{row['model']}: {row['params']:,} parameters, max_len {row['max_len']}, {row['tokens']} greedy tokens")
  print(f"window recomputed per token: {row['window_tokens_per_s']:,.0f} tokens/s")
  print(f"KV cache:                    {row['cache_tokens_per_s']:,.0f} tokens/s ({row['speedup']:.1f}x)")
  print(f"greedy outputs: the first {row['identical_prefix']} tokens identical; within the first window "
        f"({row['tokens_in_first_window']} tokens): {'identical' if row['identical_in_first_window'] else 'DIFFERENT'}")


if __name__ == "__main__":
  cli.run(main)

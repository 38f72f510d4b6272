"""Text from a trained model: `python -m launch.sample --model=WORKDIR/RUN/model --prompt="def " --tokens=64`.

--model is a model directory, a run directory (its final model) or, with --merge=N, a run's controller checkpoint
N. The same --seed prints the same text. Docs: docs/model.md.
"""

import sys

from absl import flags

from runtime import cli

_MODEL = flags.DEFINE_string("model", None, "A model directory, or a run directory (its model/ or, with --merge, a "
                             "checkpoint).")
_MERGE = flags.DEFINE_integer("merge", None, "Read Θ after this many merges from the run's checkpoints.")
_PROMPT = flags.DEFINE_string("prompt", "", "Text to continue ('' starts a new document).")
_TOKENS = flags.DEFINE_integer("tokens", 128, "Tokens to generate (fewer if the model ends the document).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.5, "Sampling temperature; 0 takes the most likely token.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens (0: all).")
_SEED = flags.DEFINE_integer("seed", 0, "Random seed: the same seed gives the same text.")


def main(argv: list[str]) -> None:
  del argv
  if not _MODEL.value:
    cli.fail("--model is required: allowed a model directory or a run directory")

  def sample() -> dict:
    from runtime.trained import sampling, saved  # pylint: disable=import-outside-toplevel  (JAX from here on)
    cfg, params, tokenizer = saved.load_model(_MODEL.value, merge=_MERGE.value)
    return sampling.generate(cfg, params, tokenizer, _PROMPT.value, tokens=_TOKENS.value,
                             temperature=_TEMPERATURE.value, top_k=_TOP_K.value, seed=_SEED.value)

  out = cli.guarded(sample)
  print(out["text"])
  print(f"({len(out['ids'])} tokens; first {out['first_token_seconds']:.2f} s with compiling, then "
        f"{out['tokens_per_second']:,.0f} tokens/s)", file=sys.stderr)


if __name__ == "__main__":
  cli.run(main)

"""A trained model for Hugging Face transformers:
`python -m launch.export --model=WORKDIR/RUN/model --output=DIR`.

--model is a model directory, a run directory (its final model) or, with --merge=N, a run's controller checkpoint
N. DIR gets model.safetensors (shards and an index above --shard_gb), config.json (Llama, Qwen3 for a Llama with
QK-norm, GPT-NeoX for a rotary GPT, GPT-2 for one with learned positions) and the tokenizer's files;
`AutoModelForCausalLM.from_pretrained(DIR)` loads it. Docs: docs/model.md.
"""

from absl import flags

from runtime import cli

_MODEL = flags.DEFINE_string("model", None, "A model directory, or a run directory (its model/ or, with --merge, a "
                             "checkpoint).")
_OUTPUT = flags.DEFINE_string("output", None, "A new or empty directory to write the Hugging Face files to.")
_MERGE = flags.DEFINE_integer("merge", None, "Export Θ after this many merges from the run's checkpoints.")
_SHARD_GB = flags.DEFINE_float("shard_gb", 5.0, "Largest safetensors file in GiB; a larger model is sharded.")


def main(argv: list[str]) -> None:
  del argv
  if not _MODEL.value or not _OUTPUT.value:
    cli.fail("--model and --output are required: allowed a model or run directory, and a new or empty directory")
  if not _SHARD_GB.value > 0:
    cli.fail(f"--shard_gb = {_SHARD_GB.value} is invalid: allowed a number > 0")

  def export() -> dict:
    from runtime.trained import export as export_lib  # pylint: disable=import-outside-toplevel  (JAX from here on)
    return export_lib.export(_MODEL.value, _OUTPUT.value, merge=_MERGE.value,
                             shard_bytes=int(_SHARD_GB.value * 2**30))

  out = cli.guarded(export)
  print(f"{out['output']}: {out['params']:,} parameters in {out['tensors']} tensors; {', '.join(out['files'])}")


if __name__ == "__main__":
  cli.run(main)

"""The built-in models and their sizes: `python -m launch.models [--vocab_size=256]`.

Prints, for each model kind and named size (`--config.model.kind`, `--config.model.size`), its shape and its
parameter count at the given vocabulary (256: text read byte-level). Counted without JAX. Docs: docs/model.md.
"""

import dataclasses

from absl import flags

from models.config import KINDS, ModelConfig, presets
from runtime import cli

_VOCAB = flags.DEFINE_integer("vocab_size", 256, "Vocabulary the parameters are counted at.")


def main(argv: list[str]) -> None:
  del argv
  if _VOCAB.value < 1:
    cli.fail(f"--vocab_size = {_VOCAB.value} is invalid: allowed an integer >= 1")
  print(f"{'kind':6}  {'size':6}  {'layers':>6}  {'d_model':>7}  {'heads':>5}  {'kv':>3}  {'mlp':>5}  {'max_len':>7}  "
        f"{'params':>13}")
  for kind in KINDS:
    for size, fields in presets(kind).items():
      cfg = dataclasses.replace(ModelConfig(kind=kind, vocab_size=_VOCAB.value), **fields)
      print(f"{kind:6}  {size:6}  {cfg.num_layers:>6}  {cfg.d_model:>7}  {cfg.num_heads:>5}  {cfg.kv_heads():>3}  "
            f"{cfg.mlp_dim:>5}  {cfg.max_len:>7}  {cfg.num_params():>13,}")


if __name__ == "__main__":
  cli.run(main)

"""The model's hyper-parameters, importable without JAX (configs are validated before JAX starts)."""

import dataclasses

VOCAB_SIZE = 256  # byte-level


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture hyper-parameters; validated in runtime.config.run."""

  num_layers: int = 2
  d_model: int = 128
  num_heads: int = 4
  mlp_dim: int = 512
  max_len: int = 128
  positions: str = "rotary"  # "rotary" | "learned"
  dtype: str = "float32"  # activation dtype; parameters stay float32
  vocab_size: int = VOCAB_SIZE

"""The model's hyper-parameters, importable without JAX (configs are validated before JAX starts)."""

import dataclasses

VOCAB_SIZE = 256  # byte-level; a prepared dataset sets its own (runtime/config/run.py)


# Named model sizes (`model.size`); fields set explicitly under `model` override the preset.
SIZES = {
    "tiny": dict(num_layers=2, d_model=64, num_heads=4, mlp_dim=256),
    "small": dict(num_layers=2, d_model=128, num_heads=4, mlp_dim=512),
    "medium": dict(num_layers=4, d_model=160, num_heads=4, mlp_dim=640),
    "base": dict(num_layers=4, d_model=256, num_heads=8, mlp_dim=1024),
    "100m": dict(num_layers=12, d_model=768, num_heads=12, mlp_dim=3072, max_len=512),
}


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
  remat: bool = False  # recompute each block's activations in the backward pass
  qk_norm: bool = False  # LayerNorm on each head's queries and keys before their dot product (QK-LayerNorm)
  z_loss: float = 0.0  # training adds z_loss × mean(log Z)², Z each position's softmax normalizer; eval is plain CE

  def num_tensors(self) -> int:
    """The parameter tensors of models/transformer.py: per block two layer norms (scale, bias), query, key, value
    and output projections, the MLP's two layers (kernel, bias) and, with qk_norm, the query and key norms (scale,
    bias); then the embedding, the final layer norm and, with learned positions, their table."""
    return (12 + 4 * self.qk_norm) * self.num_layers + 3 + (self.positions == "learned")

  def num_params(self) -> int:
    """Parameter scalars of models/transformer.py, counted without JAX (a budget in tokens per parameter is set
    before JAX starts)."""
    d, f, head = self.d_model, self.mlp_dim, self.d_model // self.num_heads
    attention = 4 * d * d + (4 * head if self.qk_norm else 0)
    block = attention + 2 * d * f + f + d + 4 * d  # MLP kernels and biases, two layer norms (scale, bias)
    positions = self.max_len * d if self.positions == "learned" else 0
    return self.num_layers * block + self.vocab_size * d + 2 * d + positions

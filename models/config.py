"""The model's hyper-parameters, importable without JAX (configs are validated before JAX starts)."""

import dataclasses
import importlib

VOCAB_SIZE = 256  # byte-level; a prepared dataset sets its own (runtime/config/run.py)
KINDS = ("gpt", "llama")  # the built-in models; any other kind is a user's model, 'package.module:spec'
RMS_EPSILON = 1e-6  # llama's RMSNorm epsilon (transformers' rms_norm_eps on export)
LAYER_NORM_EPSILON = 1e-6  # gpt's LayerNorm epsilon (flax's default; transformers' layer_norm_eps on export)
ROPE_BASE = 10_000  # rotary positions' base wavelength, both built-in models (transformers' rope_theta)

# Named model sizes (`model.size`) of each built-in kind; fields set explicitly under `model` override the preset.
# A user's model takes the GPT presets' fields (it reads what it needs of ModelConfig).
SIZES = {
    "tiny": dict(num_layers=2, d_model=64, num_heads=4, mlp_dim=256),
    "small": dict(num_layers=2, d_model=128, num_heads=4, mlp_dim=512),
    "medium": dict(num_layers=4, d_model=160, num_heads=4, mlp_dim=640),
    "base": dict(num_layers=4, d_model=256, num_heads=8, mlp_dim=1024),
    "100m": dict(num_layers=12, d_model=768, num_heads=12, mlp_dim=3072, max_len=512),
}
# Llama: SwiGLU's hidden width about 8/3 of d_model (a multiple of 16), about a quarter as many key/value heads as
# query heads from base up; "1b" is Llama 3.2 1B's shape (0.97B parameters at a byte vocabulary, 1.24B at its 128,256).
LLAMA_SIZES = {
    "tiny": dict(num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, mlp_dim=176),
    "small": dict(num_layers=2, d_model=128, num_heads=4, num_kv_heads=2, mlp_dim=352),
    "medium": dict(num_layers=4, d_model=160, num_heads=4, num_kv_heads=2, mlp_dim=432),
    "base": dict(num_layers=4, d_model=256, num_heads=8, num_kv_heads=2, mlp_dim=688),
    "100m": dict(num_layers=12, d_model=768, num_heads=12, num_kv_heads=4, mlp_dim=2048, max_len=512),
    "1b": dict(num_layers=16, d_model=2048, num_heads=32, num_kv_heads=8, mlp_dim=8192, max_len=2048,
               tied_embeddings=True),
}
PRESETS = {"gpt": SIZES, "llama": LLAMA_SIZES}


def presets(kind: str) -> dict[str, dict]:
  """The named sizes of a model kind (a user's model: the GPT presets)."""
  return PRESETS.get(kind, SIZES)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture hyper-parameters; validated in runtime.config.run."""

  kind: str = "gpt"  # "gpt", "llama", or a user's model as 'package.module:spec' (docs/model.md)
  num_layers: int = 2
  d_model: int = 128
  num_heads: int = 4
  num_kv_heads: int = 0  # llama: key/value heads shared by the query heads (grouped-query attention); 0 = num_heads
  mlp_dim: int = 512
  max_len: int = 128
  positions: str = "rotary"  # "rotary" | "learned" (gpt only)
  tied_embeddings: bool = True  # the output projection is the embedding's transpose (llama may untie it)
  dtype: str = "float32"  # activation dtype; parameters stay float32
  vocab_size: int = VOCAB_SIZE
  remat: bool = False  # recompute each block's activations in the backward pass
  qk_norm: bool = False  # normalize each head's queries and keys before their dot product (QK-norm)
  z_loss: float = 0.0  # training adds z_loss × mean(log Z)², Z each position's softmax normalizer; eval is plain CE

  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  def builtin(self) -> bool:
    return self.kind in KINDS

  def num_tensors(self) -> int:
    """Parameter tensors. GPT, per block: two layer norms (scale, bias), query, key, value and output projections,
    the MLP's two layers (kernel, bias), with qk_norm the query and key norms (scale, bias); then the embedding, the
    final norm and, with learned positions, their table. Llama, per block: two RMSNorms, four projections, gate, up
    and down, with qk_norm two more norms; then the embedding, the final norm and, untied, the output projection."""
    if self.kind == "llama":
      return (9 + 2 * self.qk_norm) * self.num_layers + 2 + (not self.tied_embeddings)
    if self.kind == "gpt":
      return (12 + 4 * self.qk_norm) * self.num_layers + 3 + (self.positions == "learned")
    return _counted(self)[0]

  def num_params(self) -> int:
    """Parameter scalars, counted without JAX for the built-in models (a budget in tokens per parameter is set
    before JAX starts); a user's model is counted from its abstract parameter tree."""
    d, f, head = self.d_model, self.mlp_dim, self.d_model // self.num_heads
    if self.kind == "llama":
      attention = 2 * d * self.num_heads * head + 2 * d * self.kv_heads() * head + (2 * head if self.qk_norm else 0)
      block = attention + 3 * d * f + 2 * d
      return self.num_layers * block + self.vocab_size * d * (1 if self.tied_embeddings else 2) + d
    if self.kind == "gpt":
      attention = 4 * d * d + (4 * head if self.qk_norm else 0)
      block = attention + 2 * d * f + f + d + 4 * d  # MLP kernels and biases, two layer norms (scale, bias)
      positions = self.max_len * d if self.positions == "learned" else 0
      return self.num_layers * block + self.vocab_size * d + 2 * d + positions
    return _counted(self)[1]


def _counted(cfg: ModelConfig) -> tuple[int, int]:
  """A user's model's (tensors, scalars), from its abstract tree: JAX is imported only for such a model, so a config
  of a built-in one is still validated before JAX starts."""
  return importlib.import_module("models.interface").counted(cfg)

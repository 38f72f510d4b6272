"""A trained Llama model in Hugging Face's format: `model.safetensors` (sharded, with an index, above
`shard_bytes`), `config.json` for transformers' LlamaForCausalLM, and the tokenizer's files, so that
`transformers.AutoModelForCausalLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` load it.

The safetensors files are written here (a little-endian u64 header length, a JSON header naming each tensor's dtype,
shape and byte range, then the bytes), so exporting needs neither torch nor transformers. A GPT model
(`model.kind = 'gpt'`: LayerNorm with biases, GELU MLP), a Llama model with QK-norm and a user's model have no
LlamaForCausalLM layout and are refused in one line.
"""

import json
import os
import pathlib
import struct
from typing import Any

import numpy as np

from models.config import RMS_EPSILON, ModelConfig
from runtime.data import tokenizers
from runtime.errors import DataError
from runtime.trained import saved

SHARD_BYTES = 5 * 2**30  # transformers' default largest shard
INDEX = "model.safetensors.index.json"
_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "int32": "I32", "int64": "I64"}
_NUMPY = {v: k for k, v in _DTYPES.items() if k != "bfloat16"}


def hf_tensors(cfg: ModelConfig, params: Any) -> dict[str, np.ndarray]:
  """The parameters under LlamaForCausalLM's names and layouts (linear weights as [out, in])."""
  d = cfg.d_model
  out = {"model.embed_tokens.weight": params["embed"]["embedding"], "model.norm.weight": params["final_norm"]["scale"]}
  if not cfg.tied_embeddings:
    out["lm_head.weight"] = params["lm_head"]["kernel"].T
  for i in range(cfg.num_layers):
    block, name = params[f"block_{i}"], f"model.layers.{i}"
    attn = block["attn"]
    out.update({
        f"{name}.input_layernorm.weight": block["attn_norm"]["scale"],
        f"{name}.self_attn.q_proj.weight": np.reshape(attn["query"]["kernel"], (d, -1)).T,  # [d, H, K]: head-major
        f"{name}.self_attn.k_proj.weight": np.reshape(attn["key"]["kernel"], (d, -1)).T,
        f"{name}.self_attn.v_proj.weight": np.reshape(attn["value"]["kernel"], (d, -1)).T,
        f"{name}.self_attn.o_proj.weight": np.reshape(attn["out"]["kernel"], (-1, d)).T,
        f"{name}.post_attention_layernorm.weight": block["mlp_norm"]["scale"],
        f"{name}.mlp.gate_proj.weight": block["gate"]["kernel"].T,
        f"{name}.mlp.up_proj.weight": block["up"]["kernel"].T,
        f"{name}.mlp.down_proj.weight": block["down"]["kernel"].T,
    })
  return {k: np.ascontiguousarray(np.asarray(v)) for k, v in out.items()}


def hf_config(cfg: ModelConfig, tokenizer: tokenizers.Tokenizer) -> dict:
  """transformers' LlamaConfig for the model."""
  return {
      "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.d_model, "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.kv_heads(),
      "head_dim": cfg.d_model // cfg.num_heads, "hidden_act": "silu", "max_position_embeddings": cfg.max_len,
      "rms_norm_eps": RMS_EPSILON, "rope_theta": 10_000.0, "rope_scaling": None,
      "tie_word_embeddings": cfg.tied_embeddings, "attention_bias": False, "mlp_bias": False,
      "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True, "torch_dtype": "float32",
      "bos_token_id": tokenizer.eod_id, "eos_token_id": tokenizer.eod_id,
  }


def refusal(cfg: ModelConfig) -> str | None:
  """Why the model has no LlamaForCausalLM layout (None: it has one)."""
  if cfg.kind != "llama":
    return (f"model.kind is {cfg.kind!r}: export writes transformers' LlamaForCausalLM, which only the 'llama' model "
            "maps onto (train with --config.model.kind=llama)")
  if cfg.qk_norm:
    return "the model has QK-norm, which LlamaForCausalLM does not (train with model.qk_norm=False to export)"
  if cfg.dtype not in ("float32", "bfloat16"):
    return f"model.dtype {cfg.dtype!r} is not exported"
  return None


def export(model: str | os.PathLike, output: str | os.PathLike, merge: int | None = None,
           shard_bytes: int = SHARD_BYTES) -> dict:
  """Writes the model at `model` (a model or run directory, as load_model reads) to `output` in Hugging Face's
  format; returns what it wrote. `output` must not exist, or be empty."""
  loaded = saved.load_model(model, merge=merge)
  why = refusal(loaded.config)
  if why:
    raise DataError(f"{model} cannot be exported: {why}")
  out = pathlib.Path(output).expanduser()
  if out.exists() and (not out.is_dir() or any(out.iterdir())):
    raise DataError(f"--output {str(out)!r} exists and is not an empty directory: allowed a new or empty directory")
  tensors = hf_tensors(loaded.config, loaded.params)
  out.mkdir(parents=True, exist_ok=True)
  files = write_safetensors(tensors, out, shard_bytes)
  (out / "config.json").write_text(json.dumps(hf_config(loaded.config, loaded.tokenizer), indent=2) + "\n")
  files += write_tokenizer(loaded.tokenizer, out)
  (out / "generation_config.json").write_text(json.dumps(
      {"bos_token_id": loaded.tokenizer.eod_id, "eos_token_id": loaded.tokenizer.eod_id}, indent=2) + "\n")
  return dict(output=str(out), files=files + ["config.json", "generation_config.json"],
              tensors=len(tensors), params=int(sum(t.size for t in tensors.values())), record=loaded.record)


def write_safetensors(tensors: dict[str, np.ndarray], out: pathlib.Path, shard_bytes: int = SHARD_BYTES) -> list[str]:
  """Writes `tensors` as model.safetensors, or as shards model-0000i-of-0000n.safetensors of at most `shard_bytes`
  each (a larger tensor alone in its shard) with the index transformers reads; returns the file names."""
  shards: list[list[str]] = [[]]
  size = 0
  for name, array in tensors.items():
    if shards[-1] and size + array.nbytes > shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(name)
    size += array.nbytes
  if len(shards) == 1:
    _write_one(out / "model.safetensors", {n: tensors[n] for n in shards[0]})
    return ["model.safetensors"]
  names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
  for file, shard in zip(names, shards):
    _write_one(out / file, {n: tensors[n] for n in shard})
  index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))},
           "weight_map": {n: file for file, shard in zip(names, shards) for n in shard}}
  (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
  return [*names, INDEX]


def _write_one(path: pathlib.Path, tensors: dict[str, np.ndarray]) -> None:
  header, offset = {"__metadata__": {"format": "pt"}}, 0
  for name, array in tensors.items():
    header[name] = {"dtype": _DTYPES[array.dtype.name], "shape": list(array.shape),
                    "data_offsets": [offset, offset + array.nbytes]}
    offset += array.nbytes
  text = json.dumps(header, separators=(",", ":")).encode()
  text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
  tmp = path.with_name(f".{path.name}.tmp")
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for array in tensors.values():
      f.write(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
  tmp.rename(path)


def read_safetensors(directory: str | os.PathLike) -> dict[str, np.ndarray]:
  """Every tensor of an exported directory (one file, or the shards its index names), as NumPy arrays."""
  directory = pathlib.Path(directory)
  files = (sorted(set(json.loads((directory / INDEX).read_text())["weight_map"].values()))
           if (directory / INDEX).exists() else ["model.safetensors"])
  out = {}
  for file in files:
    data = (directory / file).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    header.pop("__metadata__", None)
    for name, entry in header.items():
      begin, end = entry["data_offsets"]
      out[name] = np.frombuffer(data[8 + length + begin:8 + length + end],
                                np.dtype(_NUMPY[entry["dtype"]]).newbyteorder("<")).reshape(entry["shape"])
  return out


def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's byte-level alphabet: each byte as a printable character (what a ByteLevel pre-tokenizer maps to)."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[b] = chr(b)
    else:
      chars[b] = chr(256 + extra)
      extra += 1
  return chars


def byte_tokenizer_json() -> dict:
  """A tokenizer.json whose token i is byte i: a byte-level BPE with no merges (transformers'
  PreTrainedTokenizerFast reads it; text is encoded as its UTF-8 bytes)."""
  chars = _bytes_to_unicode()
  byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
  return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
          "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                    "vocab": {chars[b]: b for b in range(256)}, "merges": []}}


def write_tokenizer(tokenizer: tokenizers.Tokenizer, out: pathlib.Path) -> list[str]:
  """The tokenizer's files for transformers' AutoTokenizer; returns their names."""
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
            "add_bos_token": False, "add_eos_token": False}
  if tokenizer.kind == "byte":
    text = json.dumps(byte_tokenizer_json(), ensure_ascii=False)
    eos = _bytes_to_unicode()[tokenizer.eod_id]
  elif tokenizer.kind == "huggingface":
    text = tokenizer.serialized().decode("utf-8")
    eos = _token(text, tokenizer.eod_id)
  else:
    raise DataError(f"a {tokenizer.kind} tokenizer is not exported: allowed the byte-level tokenizer (text data) or "
                    "a Hugging Face tokenizer.json (launch.prepare_data --tokenizer=PATH)")
  (out / "tokenizer.json").write_text(text, encoding="utf-8")
  (out / "tokenizer_config.json").write_text(json.dumps(dict(config, eos_token=eos), indent=2) + "\n")
  return ["tokenizer.json", "tokenizer_config.json"]


def _token(text: str, token_id: int) -> str:
  import tokenizers as hf_tokenizers  # pylint: disable=import-outside-toplevel  (the hf extra, as reading it needed)
  return hf_tokenizers.Tokenizer.from_str(text).id_to_token(token_id)

"""A trained built-in model in Hugging Face's format: `model.safetensors` (sharded, with an index, above
`shard_bytes`), `config.json` for the transformers architecture that computes exactly its function, and the
tokenizer's files, so that `transformers.AutoModelForCausalLM.from_pretrained(DIR)` and
`AutoTokenizer.from_pretrained(DIR)` load it.

The architectures: a 'llama' model is LlamaForCausalLM, or with QK-norm (RMSNorm per head, before the rotation)
Qwen3ForCausalLM; a 'gpt' model (pre-norm LayerNorm with biases, tanh-GELU MLP with biases, attention without biases,
tied embedding) is GPTNeoXForCausalLM with rotary positions (sequential residual, the whole head rotated) and
GPT2LMHeadModel with learned ones, both with zero attention biases. A 'gpt' model with QK-norm and a user's model are
refused in one line.

The safetensors files are written here (a little-endian u64 header length, a JSON header naming each tensor's dtype,
shape and byte range, then the bytes), so exporting needs neither torch nor transformers.
"""

import json
import os
import pathlib
import struct
from typing import Any

import numpy as np

from models.config import LAYER_NORM_EPSILON, RMS_EPSILON, ROPE_BASE, ModelConfig
from runtime.data import tokenizers
from runtime.errors import DataError
from runtime.trained import saved

SHARD_BYTES = 5 * 2**30  # transformers' default largest shard
INDEX = "model.safetensors.index.json"
_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "int32": "I32", "int64": "I64"}
_NUMPY = {v: k for k, v in _DTYPES.items() if k != "bfloat16"}


# The architectures a built-in model is exported as: its tensors under that architecture's names and layouts, and its
# config.json. Linear weights are [out, in] (torch's nn.Linear) except GPT-2's Conv1D, which is [in, out].


def _zeros(n: int) -> np.ndarray:
  """The biases an architecture has where our GPT has none."""
  return np.zeros((n,), np.float32)


def _heads(kernel: Any, d: int) -> np.ndarray:
  """A [d, heads, head_dim] projection as [d, heads·head_dim] (head-major, as transformers views it)."""
  return np.reshape(np.asarray(kernel), (d, -1))


def _llama_tensors(cfg: ModelConfig, params: Any) -> dict[str, Any]:
  """LlamaForCausalLM's tensors (and Qwen3ForCausalLM's, which adds each layer's per-head query and key RMSNorm)."""
  d = cfg.d_model
  out = {"model.embed_tokens.weight": params["embed"]["embedding"], "model.norm.weight": params["final_norm"]["scale"]}
  if not cfg.tied_embeddings:
    out["lm_head.weight"] = params["lm_head"]["kernel"].T
  for i in range(cfg.num_layers):
    block, name = params[f"block_{i}"], f"model.layers.{i}"
    attn = block["attn"]
    out.update({
        f"{name}.input_layernorm.weight": block["attn_norm"]["scale"],
        f"{name}.self_attn.q_proj.weight": _heads(attn["query"]["kernel"], d).T,
        f"{name}.self_attn.k_proj.weight": _heads(attn["key"]["kernel"], d).T,
        f"{name}.self_attn.v_proj.weight": _heads(attn["value"]["kernel"], d).T,
        f"{name}.self_attn.o_proj.weight": np.reshape(attn["out"]["kernel"], (-1, d)).T,
        f"{name}.post_attention_layernorm.weight": block["mlp_norm"]["scale"],
        f"{name}.mlp.gate_proj.weight": block["gate"]["kernel"].T,
        f"{name}.mlp.up_proj.weight": block["up"]["kernel"].T,
        f"{name}.mlp.down_proj.weight": block["down"]["kernel"].T,
    })
    if cfg.qk_norm:
      out[f"{name}.self_attn.q_norm.weight"] = attn["query_norm"]["scale"]
      out[f"{name}.self_attn.k_norm.weight"] = attn["key_norm"]["scale"]
  return out


def _neox_tensors(cfg: ModelConfig, params: Any) -> dict[str, Any]:
  """GPTNeoXForCausalLM's tensors: per layer one fused query-key-value projection, laid out head by head
  ([heads, 3, head_dim] on its output axis); the attention's biases, which our GPT has not, are zeros; the output
  projection tied to the embedding."""
  d = cfg.d_model
  out = {"gpt_neox.embed_in.weight": params["embed"]["embedding"],
         "gpt_neox.final_layer_norm.weight": params["ln_final"]["scale"],
         "gpt_neox.final_layer_norm.bias": params["ln_final"]["bias"]}
  for i in range(cfg.num_layers):
    block, name = params[f"block_{i}"], f"gpt_neox.layers.{i}"
    attn = block["attn"]
    qkv = np.stack([np.asarray(attn[n]["kernel"]) for n in ("query", "key", "value")], axis=2)  # [d, H, 3, K]
    out.update({
        f"{name}.input_layernorm.weight": block["ln1"]["scale"], f"{name}.input_layernorm.bias": block["ln1"]["bias"],
        f"{name}.post_attention_layernorm.weight": block["ln2"]["scale"],
        f"{name}.post_attention_layernorm.bias": block["ln2"]["bias"],
        f"{name}.attention.query_key_value.weight": np.reshape(qkv, (d, -1)).T,
        f"{name}.attention.query_key_value.bias": _zeros(3 * d),
        f"{name}.attention.dense.weight": np.reshape(attn["out"]["kernel"], (-1, d)).T,
        f"{name}.attention.dense.bias": _zeros(d),
        f"{name}.mlp.dense_h_to_4h.weight": block["mlp_in"]["kernel"].T,
        f"{name}.mlp.dense_h_to_4h.bias": block["mlp_in"]["bias"],
        f"{name}.mlp.dense_4h_to_h.weight": block["mlp_out"]["kernel"].T,
        f"{name}.mlp.dense_4h_to_h.bias": block["mlp_out"]["bias"],
    })
  return out


def _gpt2_tensors(cfg: ModelConfig, params: Any) -> dict[str, Any]:
  """GPT2LMHeadModel's tensors: Conv1D weights [in, out], one fused query|key|value projection (each d wide,
  head-major); the attention's biases, which our GPT has not, are zeros; the output projection tied to wte."""
  d = cfg.d_model
  out = {"transformer.wte.weight": params["embed"]["embedding"], "transformer.wpe.weight": params["pos_embed"],
         "transformer.ln_f.weight": params["ln_final"]["scale"], "transformer.ln_f.bias": params["ln_final"]["bias"]}
  for i in range(cfg.num_layers):
    block, name = params[f"block_{i}"], f"transformer.h.{i}"
    attn = block["attn"]
    out.update({
        f"{name}.ln_1.weight": block["ln1"]["scale"], f"{name}.ln_1.bias": block["ln1"]["bias"],
        f"{name}.attn.c_attn.weight": np.concatenate([_heads(attn[n]["kernel"], d) for n in ("query", "key", "value")],
                                                      axis=1),
        f"{name}.attn.c_attn.bias": _zeros(3 * d),
        f"{name}.attn.c_proj.weight": np.reshape(attn["out"]["kernel"], (-1, d)),
        f"{name}.attn.c_proj.bias": _zeros(d),
        f"{name}.ln_2.weight": block["ln2"]["scale"], f"{name}.ln_2.bias": block["ln2"]["bias"],
        f"{name}.mlp.c_fc.weight": block["mlp_in"]["kernel"], f"{name}.mlp.c_fc.bias": block["mlp_in"]["bias"],
        f"{name}.mlp.c_proj.weight": block["mlp_out"]["kernel"], f"{name}.mlp.c_proj.bias": block["mlp_out"]["bias"],
    })
  return out


_TENSORS = {"LlamaForCausalLM": _llama_tensors, "Qwen3ForCausalLM": _llama_tensors,
            "GPTNeoXForCausalLM": _neox_tensors, "GPT2LMHeadModel": _gpt2_tensors}


def architecture(cfg: ModelConfig) -> str:
  """The transformers architecture that computes the built-in model's function exactly (see refusal first)."""
  if cfg.kind == "llama":
    return "Qwen3ForCausalLM" if cfg.qk_norm else "LlamaForCausalLM"
  return "GPTNeoXForCausalLM" if cfg.positions == "rotary" else "GPT2LMHeadModel"


def hf_tensors(cfg: ModelConfig, params: Any) -> dict[str, np.ndarray]:
  """The parameters under the architecture's names and layouts, as contiguous NumPy arrays."""
  out = _TENSORS[architecture(cfg)](cfg, params)
  return {k: np.ascontiguousarray(np.asarray(v)) for k, v in out.items()}


def hf_config(cfg: ModelConfig, tokenizer: tokenizers.Tokenizer) -> dict:
  """transformers' config.json for the model's architecture."""
  arch = architecture(cfg)
  rope = {"rope_type": "default", "rope_theta": float(ROPE_BASE), "partial_rotary_factor": 1.0}
  common = {"architectures": [arch], "vocab_size": cfg.vocab_size, "initializer_range": 0.02, "use_cache": True,
            "torch_dtype": "float32", "bos_token_id": tokenizer.eod_id, "eos_token_id": tokenizer.eod_id}
  if arch == "GPT2LMHeadModel":
    return {**common, "model_type": "gpt2", "n_embd": cfg.d_model, "n_layer": cfg.num_layers, "n_head": cfg.num_heads,
            "n_inner": cfg.mlp_dim, "n_positions": cfg.max_len, "n_ctx": cfg.max_len, "activation_function": "gelu_new",
            "layer_norm_epsilon": LAYER_NORM_EPSILON, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "tie_word_embeddings": True}
  if arch == "GPTNeoXForCausalLM":
    return {**common, "model_type": "gpt_neox", "hidden_size": cfg.d_model, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.mlp_dim, "hidden_act": "gelu_new",
            "max_position_embeddings": cfg.max_len, "layer_norm_eps": LAYER_NORM_EPSILON,
            "use_parallel_residual": False, "attention_bias": True, "tie_word_embeddings": True,
            "rope_parameters": rope, "rotary_pct": 1.0, "rotary_emb_base": float(ROPE_BASE),  # (the names before 5.0)
            "hidden_dropout": 0.0, "attention_dropout": 0.0}
  llama = {**common, "hidden_size": cfg.d_model, "intermediate_size": cfg.mlp_dim,
           "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
           "num_key_value_heads": cfg.kv_heads(), "head_dim": cfg.d_model // cfg.num_heads, "hidden_act": "silu",
           "max_position_embeddings": cfg.max_len, "rms_norm_eps": RMS_EPSILON, "rope_theta": float(ROPE_BASE),
           "rope_scaling": None, "tie_word_embeddings": cfg.tied_embeddings, "attention_bias": False,
           "attention_dropout": 0.0}
  if arch == "Qwen3ForCausalLM":
    return {**llama, "model_type": "qwen3", "rope_parameters": rope, "use_sliding_window": False,
            "sliding_window": None, "max_window_layers": cfg.num_layers}
  return {**llama, "model_type": "llama", "mlp_bias": False}


def refusal(cfg: ModelConfig) -> str | None:
  """Why the model has no transformers architecture that computes exactly its function (None: it has one)."""
  if not cfg.builtin():
    return (f"model.kind {cfg.kind!r} is a user's model: export knows the layouts of the built-in models only "
            "('gpt' and 'llama')")
  if cfg.kind == "gpt" and cfg.qk_norm:
    return ("a 'gpt' model with QK-norm (a LayerNorm with bias on each head's queries and keys) matches no "
            "transformers architecture exactly (train with model.qk_norm=False, or model.kind=llama, which exports "
            "with QK-norm as Qwen3)")
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
  elif tokenizer.kind == "sentencepiece":
    spec, eos = sentencepiece_tokenizer_json(tokenizer.serialized())
    text = json.dumps(spec, ensure_ascii=False)
    config["split_special_tokens"] = True  # "</s>" in a text is its characters, as SentencePiece reads it
  else:
    raise DataError(f"a {tokenizer.kind} tokenizer is not exported: allowed the byte-level tokenizer (text data), a "
                    "SentencePiece BPE model or a Hugging Face tokenizer.json")
  (out / "tokenizer.json").write_text(text, encoding="utf-8")
  (out / "tokenizer_config.json").write_text(json.dumps(dict(config, eos_token=eos), indent=2) + "\n")
  return ["tokenizer.json", "tokenizer_config.json"]


def _token(text: str, token_id: int) -> str:
  import tokenizers as hf_tokenizers  # pylint: disable=import-outside-toplevel  (the hf extra, as reading it needed)
  return hf_tokenizers.Tokenizer.from_str(text).id_to_token(token_id)


# What a SentencePiece model must be for its tokenizer.json to give its ids: launch.prepare_data's settings
# (runtime/data/tokenizers.py, train_sentencepiece). Each entry: the setting, how to read it, the value required.
_SENTENCEPIECE_EXACT = (
    ("normalization_rule_name", lambda m: m.normalizer_spec.name, "identity"),
    ("add_dummy_prefix", lambda m: m.normalizer_spec.add_dummy_prefix, False),
    ("remove_extra_whitespaces", lambda m: m.normalizer_spec.remove_extra_whitespaces, False),
    ("escape_whitespaces", lambda m: m.normalizer_spec.escape_whitespaces, True),
    ("treat_whitespace_as_suffix", lambda m: m.trainer_spec.treat_whitespace_as_suffix, False),
    ("byte_fallback", lambda m: m.trainer_spec.byte_fallback, True),
    ("model_type", lambda m: type(m.trainer_spec).ModelType.Name(m.trainer_spec.model_type), "BPE"),
)


def sentencepiece_tokenizer_json(proto: bytes) -> tuple[dict, str]:
  """A SentencePiece BPE model (serialized) as a tokenizer.json that gives the same ids, and its end-of-document
  piece. Spaces become '▁' (the only normalization of launch.prepare_data's models); the whole text is one word, as
  SentencePiece's BPE reads it; the merges are every split of a piece into two pieces, ranked by the piece's score
  (SentencePiece merges the adjacent pair whose piece scores highest); characters outside the vocabulary fall back to
  their bytes. A model trained otherwise is refused in one line naming the setting."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=import-outside-toplevel
  model, kinds = sentencepiece_model_pb2.ModelProto(), sentencepiece_model_pb2.ModelProto.SentencePiece  # piece types
  model.ParseFromString(proto)
  for field, read, required in _SENTENCEPIECE_EXACT:
    if read(model) != required:
      raise DataError(f"the SentencePiece model has {field} = {read(model)!r}; only a model with {field} = "
                      f"{required!r} exports with the same ids, as launch.prepare_data --tokenizer=sentencepiece "
                      "trains them with --sentencepiece_type=bpe")
  pieces = model.pieces
  if any(p.type == kinds.USER_DEFINED for p in pieces):
    raise DataError("the SentencePiece model has user-defined pieces, which are not exported: allowed a model "
                    "trained by launch.prepare_data")
  vocab = {p.piece: i for i, p in enumerate(pieces)}
  merges = []
  for i in sorted((i for i, p in enumerate(pieces) if p.type == kinds.NORMAL), key=lambda i: (-pieces[i].score, i)):
    piece = pieces[i].piece
    splits = [(vocab[piece[:k]], vocab[piece[k:]]) for k in range(1, len(piece))
              if piece[:k] in vocab and piece[k:] in vocab]
    merges += [[pieces[a].piece, pieces[b].piece] for a, b in sorted(splits)]
  unk = next(p.piece for p in pieces if p.type == kinds.UNKNOWN)
  eos = pieces[model.trainer_spec.eos_id].piece
  # No added tokens: the control pieces are in the vocabulary, and no text is read as one (as in SentencePiece).
  return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
          "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
          "pre_tokenizer": None, "post_processor": None,
          "decoder": {"type": "Sequence", "decoders": [
              {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
              {"type": "ByteFallback"}, {"type": "Fuse"}]},
          "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                    "vocab": vocab, "merges": merges}}, eos

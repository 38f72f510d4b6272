"""Text from a trained model: one jitted program per token over a fixed-length window (recomputed, no KV cache).

Each new token reruns the model on the last `max_len` tokens, padded to `max_len` so that one program serves every
step; the model is causal, so padding after the last real token changes nothing before it. For the model sizes here
(up to 100m parameters, 512 positions) that is fast enough: `launch.sample` prints its tokens/s (docs/model.md).
The same seed gives the same text: step i samples with `fold_in(key(seed), i)`.
"""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from models.config import ModelConfig
from models.transformer import TransformerLM
from runtime.data import tokenizers
from runtime.errors import DataError


@functools.partial(jax.jit, static_argnames=("cfg", "top_k"))
def _next_token(params, cfg: ModelConfig, window_1xL: jax.Array, length: jax.Array, key: jax.Array,
                temperature: jax.Array, top_k: int) -> jax.Array:
  """The token after window[:length]: greedy at temperature 0, else sampled from the `top_k` most likely."""
  logits_V = TransformerLM(cfg).apply({"params": params}, window_1xL)[0, length - 1].astype(jnp.float32)
  if top_k:
    cutoff = jax.lax.top_k(logits_V, top_k)[0][-1]
    logits_V = jnp.where(logits_V < cutoff, -jnp.inf, logits_V)
  sampled = jax.random.categorical(key, logits_V / jnp.maximum(temperature, 1e-6))
  return jnp.where(temperature > 0, sampled, jnp.argmax(logits_V))


def generate(cfg: ModelConfig, params, tokenizer: tokenizers.Tokenizer, prompt: str, *, tokens: int,
             temperature: float = 0.5, top_k: int = 0, seed: int = 0, stop_at_end: bool = True) -> dict:
  """Continues `prompt` by up to `tokens` tokens; returns the text, its ids and the rate."""
  if tokens < 1:
    raise DataError(f"--tokens = {tokens} is invalid: allowed an integer >= 1")
  if temperature < 0:
    raise DataError(f"--temperature = {temperature} is invalid: allowed a number >= 0 (0: the most likely token)")
  if not 0 <= top_k <= cfg.vocab_size:
    raise DataError(f"--top_k = {top_k} is invalid: allowed 0 (all tokens) to the vocabulary ({cfg.vocab_size})")
  ids = [int(i) for i in tokenizer.encode([prompt.encode("utf-8")])[0]]
  if len(ids) > cfg.max_len:
    raise DataError(f"--prompt is {len(ids)} tokens long: allowed at most the model's max_len ({cfg.max_len})")
  if not ids:
    ids = [tokenizer.eod_id]  # an empty prompt starts a new document
  prompt_length = len(ids)
  key = jax.random.key(seed)
  window = np.zeros((1, cfg.max_len), np.int32)
  start = first = time.perf_counter()
  for i in range(tokens):
    if i == 1:
      first = time.perf_counter()  # the first token includes compiling the program
    context = ids[-cfg.max_len:]
    window[0, :len(context)] = context
    window[0, len(context):] = 0
    token = int(_next_token(params, cfg, window, len(context), jax.random.fold_in(key, i), temperature, top_k))
    if stop_at_end and token == tokenizer.eod_id:
      break
    ids.append(token)
  end = time.perf_counter()
  new = ids[prompt_length:]
  text = tokenizer.decode(ids[1:] if not prompt else ids)
  return dict(text=text, ids=new, first_token_seconds=first - start,
              tokens_per_second=(len(new) - 1) / (end - first) if len(new) > 1 else float("nan"))

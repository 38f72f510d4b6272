"""Text from a trained model, with a KV cache (the built-in models) or by recomputing the window (a user's model).

With a cache, a segment is one jitted program: it fills the cache from the context (padded to max_len; the model is
causal, so the padding changes nothing before it), then takes up to max_len − len(context) + 1 tokens, each one
position of every layer, in an on-device loop. While prompt and output fit in max_len this is the window
recomputation's output (the same logits to float rounding, so the same greedy text). When the cache is full, the
next segment starts from the last max_len / 2 tokens; the window recomputation instead slides by one token per
token, each token's context its last max_len tokens, which a cache cannot reproduce (a token's keys depend on what
preceded it in its window), at the cost of a whole window per token. A model without a cache (`decodes=False`)
samples that way: one program per token over the last max_len tokens. The same seed gives the same text: token i
is drawn with `fold_in(key(seed), i)`.
"""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from models import lm
from models.config import ModelConfig
from runtime.data import tokenizers
from runtime.errors import DataError


def _choose(logits_V: jax.Array, key: jax.Array, temperature: jax.Array, top_k: int) -> jax.Array:
  """Greedy at temperature 0, else sampled from the `top_k` most likely (all with 0)."""
  logits_V = logits_V.astype(jnp.float32)
  if top_k:
    cutoff = jax.lax.top_k(logits_V, top_k)[0][-1]
    logits_V = jnp.where(logits_V < cutoff, -jnp.inf, logits_V)
  sampled = jax.random.categorical(key, logits_V / jnp.maximum(temperature, 1e-6))
  return jnp.where(temperature > 0, sampled, jnp.argmax(logits_V))


@functools.partial(jax.jit, static_argnames=("cfg", "top_k"))
def _next_token(params, cfg: ModelConfig, window_1xL: jax.Array, length: jax.Array, key: jax.Array,
                temperature: jax.Array, top_k: int) -> jax.Array:
  """The token after window[:length], the whole window recomputed."""
  return _choose(lm.logits(params, cfg, window_1xL)[0, length - 1], key, temperature, top_k)


@functools.partial(jax.jit, static_argnames=("cfg", "top_k"))
def _segment(params, cfg: ModelConfig, window_1xL: jax.Array, length: jax.Array, count: jax.Array, key: jax.Array,
             first: jax.Array, temperature: jax.Array, top_k: int) -> jax.Array:
  """`count` tokens after window[:length] (at most max_len − length + 1), token j drawn with fold_in(key, first + j);
  returns them in a [max_len + 1] buffer."""
  logits_1xLxV, cache = lm.decode(params, cfg, lm.empty_cache(cfg, 1), window_1xL)
  cache = lm.at_position(cache, length)

  def step(j, carry):
    out, cache, logits_V = carry
    token = _choose(logits_V, jax.random.fold_in(key, first + j), temperature, top_k).astype(jnp.int32)
    logits_1x1xV, cache = lm.decode(params, cfg, cache, token[None, None])
    return out.at[j].set(token), cache, logits_1x1xV[0, 0]

  out = jnp.zeros((cfg.max_len + 1,), jnp.int32)
  return jax.lax.fori_loop(0, count, step, (out, cache, logits_1xLxV[0, length - 1]))[0]


def generate(cfg: ModelConfig, params, tokenizer: tokenizers.Tokenizer, prompt: str, *, tokens: int,
             temperature: float = 0.5, top_k: int = 0, seed: int = 0, stop_at_end: bool = True,
             cache: bool = True) -> dict:
  """Continues `prompt` by up to `tokens` tokens; returns the text, its ids and the rate. `cache=False` recomputes
  the window for every token (what a model without a cache does)."""
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
  sample = _cached if cache and lm.decodes(cfg) else _windowed
  start = time.perf_counter()
  first, timed = sample(cfg, params, ids, tokens, jax.random.key(seed), temperature, top_k,
                        tokenizer.eod_id if stop_at_end else None)
  end = time.perf_counter()
  new = ids[prompt_length:]
  text = tokenizer.decode(ids[1:] if not prompt else ids)
  return dict(text=text, ids=new, first_token_seconds=first - start,
              tokens_per_second=timed / (end - first) if timed else float("nan"))


def _windowed(cfg: ModelConfig, params, ids: list[int], tokens: int, key: jax.Array, temperature: float, top_k: int,
              end_id: int | None) -> tuple[float, int]:
  """Appends up to `tokens` tokens to `ids`, one program over the last max_len tokens per token; returns the time
  the first token was ready (it includes compiling the program) and the tokens taken after it."""
  window = np.zeros((1, cfg.max_len), np.int32)
  first = time.perf_counter()
  for i in range(tokens):
    context = ids[-cfg.max_len:]
    window[0, :len(context)] = context
    window[0, len(context):] = 0
    token = int(_next_token(params, cfg, window, len(context), jax.random.fold_in(key, i), temperature, top_k))
    if i == 0:
      first = time.perf_counter()
    if token == end_id:
      return first, i
    ids.append(token)
  return first, tokens - 1


def _cached(cfg: ModelConfig, params, ids: list[int], tokens: int, key: jax.Array, temperature: float, top_k: int,
            end_id: int | None) -> tuple[float, int]:
  """Appends up to `tokens` tokens to `ids`, a segment at a time (see the module docstring); returns the time its
  program was compiled and the context read (a segment of no tokens), and the tokens taken after it."""
  window = np.zeros((1, cfg.max_len), np.int32)
  done, context = 0, ids
  window[0, :len(context)] = context
  jax.block_until_ready(_segment(params, cfg, window, len(context), 0, key, 0, temperature, top_k))
  first = time.perf_counter()
  while done < tokens:
    window[0, :len(context)] = context
    window[0, len(context):] = 0
    count = min(tokens - done, cfg.max_len - len(context) + 1)
    new = [int(t) for t in np.asarray(_segment(params, cfg, window, len(context), count, key, done, temperature,
                                               top_k))[:count]]
    if end_id in new:
      ids.extend(new[:new.index(end_id)])
      return first, done + new.index(end_id) + 1
    ids.extend(new)
    done += count
    context = ids[-(cfg.max_len // 2):]
  return first, done

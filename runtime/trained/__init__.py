"""The trained model as a run's output: saved at the end of every run, loaded in one call, sampled and evaluated.

`load_model(path)` returns `(config, params, tokenizer)` for a model directory, a run directory or (`merge=N`) a
run's controller checkpoint; it imports JAX, so the command line's boundary never imports this package.
"""

from runtime.trained.saved import load_model  # noqa: F401  (the public entry point)

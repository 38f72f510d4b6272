"""Decoupled DiLoCo runtime: learners, syncer, controller, data and metrics.

A trained model loads with `from runtime.trained import load_model` (runtime/trained/saved.py).
"""

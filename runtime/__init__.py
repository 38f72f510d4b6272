"""Decoupled DiLoCo runtime: learners, syncer, controller, data and metrics."""

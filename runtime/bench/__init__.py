"""Benchmarks behind `launch.benchmark` and `launch.bench_merge`: commands, not tests."""

"""Benchmarks: figures printed side by side, and pictures in ``bench/results/``."""

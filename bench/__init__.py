"""Benchmarks: each module measures a ratio against a baseline run in the same process."""

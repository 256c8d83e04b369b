"""Benchmarks: routing speed against the reference, and the peak memory of loading a router."""

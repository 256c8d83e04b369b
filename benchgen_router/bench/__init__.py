"""Benchmarks as library code: routing speed, the service under load, memory of loading and streaming."""

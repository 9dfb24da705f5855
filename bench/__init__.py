"""Benchmarks, load generation and the crash-recovery verifier."""

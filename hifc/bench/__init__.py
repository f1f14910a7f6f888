"""Benchmarks: decode throughput, flash tier I/O and initialisation."""

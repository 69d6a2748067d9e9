"""Benchmark helpers: batch search by real OOM, workloads probed in fresh processes, report formatting."""

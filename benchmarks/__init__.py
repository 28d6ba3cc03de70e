"""Benchmarks, sorted by kind (benchmarks/README.md is the index). Run each as a module from the repository
root, e.g. `python -m benchmarks.speed.round_throughput`."""

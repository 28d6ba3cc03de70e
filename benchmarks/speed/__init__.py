"""Speed: throughput, step, round overhead, memory and accelerator benchmarks (README.throughput.md)."""

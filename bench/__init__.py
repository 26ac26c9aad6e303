"""Load benchmarks for stillhere (see bench/README.md)."""

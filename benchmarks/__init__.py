"""Benchmarks (`make bench`): heavy checks that report ratios measured in one run."""

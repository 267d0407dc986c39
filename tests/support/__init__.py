"""Fixtures shared by tests and benchmarks: synthetic datasets, task corpora, references."""

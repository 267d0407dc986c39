"""What both command lines share besides the data contract: the click group plumbing (one error line,
signals, child processes, the stderr filter) and the output lock. A layer of its own, above `contract`
and below `pipelines` and `trainer` (tests/project/test_layering.py)."""

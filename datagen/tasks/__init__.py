"""Fine-tuning task data: labelled task files -> the original run_classifier.py / run_squad.py features.

Pure per-example logic (no Beam, no TensorFlow): reading task files (`delimited`, `glue`, `squad`,
`conll`), building features (`classify`, `squad`, `tagging`), the task config (`config`) and the
record layouts (`features`). `pipelines/tasks/graph.py` wires them into a dataset.
"""

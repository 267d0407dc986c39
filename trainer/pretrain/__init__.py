"""Pre-training: the loop, its input pipeline and objective, evaluation, `bert-train pretrain|eval`."""

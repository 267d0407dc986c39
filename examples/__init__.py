"""Runnable end-to-end demos (`make pretrain`, `make finetune`); not part of the library."""

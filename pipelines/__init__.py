"""Beam wiring, runners and the `bert-datagen` command line."""

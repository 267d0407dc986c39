"""Pure per-document data generation: no Beam, no TensorFlow."""

__version__ = "0.1.0"

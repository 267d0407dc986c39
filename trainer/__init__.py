"""The Keras 3 / TensorFlow trainer: the only package that imports TensorFlow."""

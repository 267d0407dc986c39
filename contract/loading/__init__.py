"""Loading a dataset without TensorFlow: one global sample order (`order`), the records it names
(`source`), a NumPy batch iterator (`batches`) and a PyTorch adapter (`torch_adapter`, torch optional).
See docs/loading.md."""

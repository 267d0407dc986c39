"""The BERT network: the pre-training model, the fine-tuning heads, the TF1 weight names."""

"""Other checkpoint formats: Google's TF1 and Hugging Face, loading and `bert-train export`."""

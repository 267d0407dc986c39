"""`bert-datagen verify | inspect | stats | diff` on pre-training datasets."""

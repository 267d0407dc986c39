"""`bert-datagen run`: the pre-training data pipeline, its DoFns, driver and card."""

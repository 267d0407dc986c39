"""`bert-datagen task`: the task data pipeline, its driver, card and tools."""

"""Fine-tuning: the run, task data, initialisation, predictions and task metrics, `bert-train finetune|predict`."""

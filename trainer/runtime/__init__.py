"""What every run shares: configs, the training step, optimizers, devices, run directories, checkpoints, errors, the tf.io.gfile filesystem."""

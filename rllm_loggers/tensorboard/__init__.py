"""The `tensorboard` logger: scalars in `<run>/tensorboard/` for `tensorboard --logdir <run>`."""

"""The `wandb` logger: a W&B run in `<run>/wandb/`, offline unless online logging is asked for explicitly."""

"""Built-in metric loggers for `rllm train --logger NAME`, each a plugin of the ``rllm_register_loggers`` hook
(see rllm_core.loggers): `tensorboard` (extra rllm[tensorboard]) and `wandb` (extra rllm[wandb]). Their
packages are imported only when a run asks for them, so listing plugins never loads TensorBoard or W&B."""

"""`rllm export`: a trained run as a model to hand on (Hugging Face layout, merged LoRA, GGUF).

`hf.export_checkpoint` does the work; `plugin` registers the command. Nothing is imported here, so building the
CLI (which loads `plugin`) does not load torch.
"""

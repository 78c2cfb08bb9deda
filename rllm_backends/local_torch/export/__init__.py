"""`rllm export`: a trained run as a model to hand on (Hugging Face layout, merged LoRA, GGUF)."""

from rllm_backends.local_torch.export.hf import ExportResult, export_checkpoint

__all__ = ["ExportResult", "export_checkpoint"]

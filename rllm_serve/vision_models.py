"""Vision-language models as the server and trainer load them: a model directory or Hub id, and ``tiny-vlm``.

A directory (or id) whose config has a vision tower loads with `AutoModelForImageTextToText` and its
`AutoProcessor` (the image processor that expands image markers into image tokens); SmolVLM / Idefics3 serve and
train here. So do Qwen2-VL and Qwen2.5-VL (3-D rotary positions, vision.py), with one adjustment: transformers'
`Qwen2VLProcessor` insists on its video processor, which needs torchvision (it does not install beside this torch),
so they get `ImagesOnlyQwen2VLProcessor`: the same processor class, images only.

``tiny-vlm``: a seeded random SmolVLM (transformers' Idefics3) built in code, for tests and smoke runs;
``tiny-qwen2-vl``: the same for Qwen2-VL.

SmolVLM is SmolLM2 with a SigLIP vision tower and a pixel-shuffle connector, so this one reuses the embedded
model's tokenizer with SmolVLM's image tokens added (`<image>`, `<fake_token_around_image>`, `<global-img>`, the
`<row_i_col_j>` tags) and SmolLM2's ChatML template, taught to render a message's image parts as `<image>`. Its
text model is tiny-random's shape (hidden 64, 2 layers); its vision tower is one 32-wide layer over 64×64 images
in 16-pixel patches, so an image becomes 4 `<image>` tokens after the connector (scale factor 2). Nothing is
downloaded: the processor is transformers' PIL image processor (no torchvision), one global image, no splitting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "TINY_QWEN2_VL",
    "TINY_VLM",
    "VISION_CHAT_TEMPLATE",
    "is_vision_dir",
    "load_vision_model",
    "processor_of",
    "tiny_qwen2_vl",
    "tiny_vlm",
    "tiny_vlm_tokenizer",
]

TINY_VLM = "tiny-vlm"
TINY_QWEN2_VL = "tiny-qwen2-vl"
_SEED = 4321
IMAGE_SIZE = 64

VISION_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2's ChatML template, with a content list's image parts rendered as SmolVLM's `<image>` marker."""

_IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                 *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))]


Base = Callable[[str], Any]
"""`models.load_model`, handed in by the caller (this module never imports models.py: it is imported by it)."""


def tiny_vlm_tokenizer(base: Base) -> Any:
    """SmolLM2's tokenizer with SmolVLM's image tokens and the image-aware chat template."""
    tok = base("tiny-random").tokenizer
    tok.add_special_tokens({"additional_special_tokens": _IMAGE_TOKENS})
    tok.chat_template = VISION_CHAT_TEMPLATE
    return tok


def tiny_vlm(dtype: torch.dtype, base: Base) -> tuple[Any, Any, Any]:
    """(model, tokenizer, processor) of the seeded random SmolVLM (module docstring)."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3 import Idefics3ImageProcessorPil

    tok = tiny_vlm_tokenizer(base)
    images = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": IMAGE_SIZE},
                                       max_image_size={"longest_edge": IMAGE_SIZE})
    processor = Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=4,
                                  chat_template=VISION_CHAT_TEMPLATE)
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id, initializer_range=0.3, model_type="llama")
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=IMAGE_SIZE, patch_size=16)
    config = Idefics3Config(vision_config=vision, text_config=text, scale_factor=2, tie_word_embeddings=True,
                            image_token_id=tok.convert_tokens_to_ids("<image>"), pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        model = Idefics3ForConditionalGeneration(config)
    model.config.name_or_path = TINY_VLM
    model.generation_config.eos_token_id = tok.eos_token_id
    return model.to(dtype).eval(), tok, processor


QWEN_VL = ("qwen2_vl", "qwen2_5_vl")
"""Families loaded with the images-only Qwen2-VL processor."""


def images_only_qwen_processor() -> type:
    """`Qwen2VLProcessor` without its video processor (module docstring); built on first use."""
    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImagesOnlyQwen2VLProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None,
                     **kwargs: Any) -> None:
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    return ImagesOnlyQwen2VLProcessor


QWEN_CHAT_TEMPLATE = VISION_CHAT_TEMPLATE.replace("'<image>'", "'<|vision_start|><|image_pad|><|vision_end|>'")


def tiny_qwen2_vl(dtype: torch.dtype, base: Base) -> tuple[Any, Any, Any]:
    """(model, tokenizer, processor) of a seeded random Qwen2-VL: tiny-random's text shape with 3-D rotary
    sections, a one-layer vision tower over 14-pixel patches merged 2×2, SmolLM2's tokenizer + Qwen's vision
    tokens; images are resized to at most 56×56 (4-16 image tokens)."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    tok = base("tiny-random").tokenizer
    tok.add_special_tokens({"additional_special_tokens": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                                                         "<|video_pad|>"]})
    tok.chat_template = QWEN_CHAT_TEMPLATE
    images = Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=56 * 56 * 4, patch_size=14, merge_size=2)
    processor = images_only_qwen_processor()(image_processor=images, tokenizer=tok, chat_template=QWEN_CHAT_TEMPLATE)
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, initializer_range=0.3,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": [2, 3, 3]})
    vision = dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                  spatial_merge_size=2, in_chans=3, temporal_patch_size=2)
    config = Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True,
                           image_token_id=processor.image_token_id, video_token_id=processor.video_token_id,
                           vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        model = Qwen2VLForConditionalGeneration(config)
    model.config.name_or_path = TINY_QWEN2_VL
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    return model.to(dtype).eval(), tok, processor


def is_vision_dir(path: str, local_only: bool) -> bool:
    """The model at `path` (a directory or Hub id) is a vision-language model (its config has a vision tower)."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(path, local_files_only=local_only)
    except (OSError, ValueError):
        return False  # the text loader says what is wrong with it
    return getattr(cfg, "vision_config", None) is not None


def load_vision_model(path: str, dtype: torch.dtype, local_only: bool) -> tuple[Any, Any, Any]:
    """(model, tokenizer, processor) of a vision-language model directory or id."""
    from transformers import AutoModelForImageTextToText

    processor = processor_of(path, local_only)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, local_files_only=local_only)
    return model, processor.tokenizer, processor


def processor_of(path: str, local_only: bool) -> Any:
    """A model directory's (or id's) processor: `AutoProcessor`, or the images-only one for Qwen2-VL."""
    from transformers import AutoConfig, AutoImageProcessor, AutoProcessor, AutoTokenizer

    if AutoConfig.from_pretrained(path, local_files_only=local_only).model_type not in QWEN_VL:
        return AutoProcessor.from_pretrained(path, local_files_only=local_only)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
    images = AutoImageProcessor.from_pretrained(path, local_files_only=local_only)
    return images_only_qwen_processor()(image_processor=images, tokenizer=tok,
                                        chat_template=getattr(tok, "chat_template", None))


def smollm2_vision(dtype: torch.dtype, base: Base) -> tuple[Any, Any, Any]:
    """The embedded SmolLM2-135M-Instruct as the text model of a SmolVLM (Idefics3) whose vision tower and
    connector are seeded random: a warm language model with a cold eye. Nothing is downloaded, so it is how the
    offline path shows RL learning to use images (geometry-shapes); its vision tower trains with
    `backend_options.train_vision`. 128×128 images, 16-pixel patches, pixel shuffle 2: 16 image tokens each."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3 import Idefics3ImageProcessorPil

    smollm2 = base("smollm2-135m")
    tok = smollm2.tokenizer
    tok.add_special_tokens({"additional_special_tokens": _IMAGE_TOKENS})
    tok.chat_template = VISION_CHAT_TEMPLATE
    smollm2.model.resize_token_embeddings(len(tok), mean_resizing=True)
    size = 128
    images = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": size},
                                       max_image_size={"longest_edge": size})
    processor = Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=16,
                                  chat_template=VISION_CHAT_TEMPLATE)
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  image_size=size, patch_size=16)
    config = Idefics3Config(vision_config=vision, text_config=smollm2.model.config.to_dict(), scale_factor=2,
                            tie_word_embeddings=True, image_token_id=tok.convert_tokens_to_ids("<image>"),
                            pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        model = Idefics3ForConditionalGeneration(config)
    model.model.text_model.load_state_dict(smollm2.model.model.state_dict())
    model.lm_head.weight = model.model.text_model.embed_tokens.weight
    model.config.name_or_path = SMOLLM2_VISION
    model.generation_config = smollm2.model.generation_config
    return model.to(dtype).eval(), tok, processor


SMOLLM2_VISION = "smollm2-135m-vision"
BUILTIN_VISION = {TINY_VLM: tiny_vlm, TINY_QWEN2_VL: tiny_qwen2_vl, SMOLLM2_VISION: smollm2_vision}
"""The built-in vision-language models, by name: each builds (model, tokenizer, processor) in code."""

"""The bundled tiny vision-language models: their names, families and shapes (one definition for the
trainer, which builds them in tuiapp.trainer.models.vision, and for the checks and the estimate)."""

from __future__ import annotations

TINY_VLMS = {"tiny-vlm": "gemma3", "tiny-llava": "llava"}  # name -> the real family its config comes from
TEXT_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512}
VISION_SHAPE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                "image_size": 32, "patch_size": 8}
TOKENS_PER_IMAGE = {"gemma3": 4 + 2, "llava": (VISION_SHAPE["image_size"] // VISION_SHAPE["patch_size"]) ** 2}
VOCAB_SIZE = 2048  # an upper bound of the bundled tokenizer with the image tokens


def is_tiny_vlm(name: str) -> bool:
    return name in TINY_VLMS


def image_tokens(name: str) -> int:
    """Tokens one image takes in the sequence (Gemma 3: 4 pooled soft tokens between its start and end
    markers; LLaVA: one per 8x8 patch of the 32x32 image)."""
    return TOKENS_PER_IMAGE[TINY_VLMS[name]]


def estimate_config(name: str) -> dict:
    """The model's config, as the memory estimate reads it: the language model (a Llama of the text
    shape, its vocab an upper bound) and the family's vision part (tower and projector counted exactly)."""
    family = TINY_VLMS[name]
    vision = {**VISION_SHAPE, "model_type": "siglip_vision_model" if family == "gemma3" else "clip_vision_model"}
    extra = {"mm_tokens_per_image": 4} if family == "gemma3" else {"vision_feature_layer": -1}
    return {"architectures": ["LlamaForCausalLM"], "model_type": family, "vocab_size": VOCAB_SIZE,
            "tie_word_embeddings": family == "gemma3", "hidden_act": "silu", "rms_norm_eps": 1e-6, **TEXT_SHAPE,
            "vision_config": vision, **extra}

"""Hugging Face checkpoints to CMF: safetensors reading, the Qwen3.5 converter, and the derived
Qwen3.5 tokenizer.json."""

from cortiq_drv.convert.qwen35 import QUANTS, convert

__all__ = ["QUANTS", "convert"]

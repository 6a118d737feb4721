"""Constants and the error type of the GPU check."""

from __future__ import annotations

FREEFORM_TOKENS = 128
DEFAULT_TURNS = 20
DEFAULT_WARMUP = 2
HEALTH_TIMEOUT_S = 900.0  # the first start captures CUDA graphs and may compile kernels
MEM_FRACTION_STATIC = 0.8
IMAGE_SIZE = (448, 320)  # 14 x 10 merged patches: 140 image tokens
CACHE_REUSE_FLOOR = 0.95
TORCH_CACHE_BYTES = 16 << 30
MAX_SHARD_BYTES = 4 << 30

EXIT_NO_GPU = 2
EXIT_NO_SGLANG = 3
EXIT_FAILED = 1

# The real Qwen2/Qwen3 special-token ids (tiny.build_tokenizer("qwen") reproduces them; checked at build).
BOS_ID = 151643  # <|endoftext|>
EOS_ID = 151645  # <|im_end|>
VISION_START_ID = 151652
VISION_END_ID = 151653
IMAGE_TOKEN_ID = 151655
VIDEO_TOKEN_ID = 151656
_EXPECTED_IDS = {"<|endoftext|>": BOS_ID, "<|im_end|>": EOS_ID, "<|vision_start|>": VISION_START_ID,
                 "<|vision_end|>": VISION_END_ID, "<|image_pad|>": IMAGE_TOKEN_ID,
                 "<|video_pad|>": VIDEO_TOKEN_ID}

# Entities of the demo world whose pictures the three contexts carry (same size, different pixels).
SSR_ENTITY, FREEFORM_ENTITY, WARMUP_ENTITY = ("k-eiffel-tower", "k-golden-gate-bridge",
                                              "k-great-pyramid-of-giza")
QUESTION = "How tall is the structure in this image, in metres?"
ENGINES = ("sglang", "torch")


class CheckError(Exception):
    """A condition that ends the check with a message and an exit code (no traceback)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

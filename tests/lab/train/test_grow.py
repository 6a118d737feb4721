"""Growing the language model: appended identity layers change nothing until trained, keep their own
KV-cache slots, learn, and a grown SFT run saves, resumes and serves."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import torch

from ssr_lab.train.grow import grow_language_model
from ssr_lab.train.setup import load_model
from ssr_lab.train.sft import SFTConfig, train_sft


def _last_logits(model: Any, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The last position's logits from one full forward and from a cached prefix plus one step."""
    with torch.no_grad():
        full = model(input_ids=ids).logits[0, -1]
        prefix = model(input_ids=ids[:, :-1], use_cache=True)
        step = model(input_ids=ids[:, -1:], cache=prefix.past_key_values, use_cache=True)
    return full, step.logits[0, -1]


def test_grown_layers_start_as_the_identity_with_their_own_cache_slots_then_learn(
        tiny_model_dir: Path) -> None:
    model, tok = load_model(tiny_model_dir)
    model.eval()
    ids = torch.tensor([tok.encode("Which city is the Eiffel Tower in? Paris, in France.")])
    full, step = _last_logits(model, ids)
    layers = model.model.language_model.layers
    depth = len(layers)
    grow_language_model(model, 2)
    assert len(layers) == depth + 2 == model.config.text_config.num_hidden_layers
    assert [layer.self_attn.layer_idx for layer in layers] == list(range(depth + 2))
    grown_full, grown_step = _last_logits(model, ids)
    assert torch.equal(full, grown_full)
    # a cached step reads each layer's own keys: a copied index would feed the last layer twice its keys
    torch.testing.assert_close(grown_step, step)
    torch.testing.assert_close(grown_step, grown_full, rtol=1e-4, atol=1e-4)
    model.train()
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
    loss.backward()  # type: ignore[no-untyped-call]
    for proj in (layers[-1].self_attn.o_proj, layers[-1].mlp.down_proj):
        assert proj.weight.grad is not None and float(proj.weight.grad.abs().sum()) > 0


def test_sft_with_grown_layers_saves_resumes_and_serves_the_grown_model(world_dir: Path,
                                                                      tmp_path: Path) -> None:
    from ssr_server.engine.torch.engine import TorchEngine

    base = SFTConfig(world=world_dir, out=tmp_path / "base", init="64x1", steps=1, batch_size=2, limit=8,
                     threads=1, warmup=1)
    train_sft(base, progress=False)
    out = tmp_path / "grown"
    cfg = SFTConfig(**{**base.__dict__, "out": out, "init": str(base.out), "steps": 2, "save_every": 1,
                       "log_every": 1, "grow_layers": 1, "lr": 1e-2})
    train_sft(cfg, progress=False)
    assert json.loads((out / "config.json").read_text())["text_config"]["num_hidden_layers"] == 2
    trained, _ = load_model(out)  # the new layer loads as trained: its output projection moved off zero
    assert float(trained.model.language_model.layers[1].mlp.down_proj.weight.detach().abs().sum()) > 0
    # resuming grows the start again, then loads the checkpoint into it (shapes match, depth stays 2)
    train_sft(SFTConfig(**{**cfg.__dict__, "steps": 3}), progress=False)
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]
    assert json.loads((out / "config.json").read_text())["text_config"]["num_hidden_layers"] == 2
    engine = TorchEngine(str(out))
    asyncio.run(engine.close())

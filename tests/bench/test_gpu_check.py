"""The GPU check on a CPU machine: shapes, parameter counts, the plan, the refusal without CUDA, and the
build-and-measure path on a tiny shape with the embedded engine (the figures mean nothing on a CPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ssr_server.bench import gpu_check as gc

TINY = gc.Shape(name="tiny", reference="test", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=32, mrope_section=(6, 5, 5),
                vision_depth=1, vision_hidden_size=32, vision_intermediate_size=64, vision_heads=1,
                num_position_embeddings=256, deepstack_visual_indexes=(0,))


@pytest.mark.parametrize(("shape", "low", "high"), [("2b", 2.0e9, 2.3e9), ("4b", 4.2e9, 4.6e9)])
def test_parameter_count_in_the_public_ballpark(shape: str, low: float, high: float) -> None:
    n = gc.count_parameters(shape)  # on the meta device: no memory
    assert low <= n <= high, f"{shape}: {n / 1e9:.3f}B"


@pytest.mark.parametrize("shape", ["2b", "4b"])
def test_config_reads_as_the_public_qwen3_vl(shape: str) -> None:
    sh = gc.SHAPES[shape]
    cfg = gc.qwen3vl_config(shape)
    tc, vc = cfg.text_config, cfg.vision_config
    assert (tc.vocab_size, tc.head_dim, tc.num_key_value_heads) == (151936, 128, 8)
    assert (tc.hidden_size, tc.num_hidden_layers) == {"2b": (2048, 28), "4b": (2560, 36)}[shape]
    assert tc.rope_parameters["mrope_section"] == [24, 20, 20]
    assert tc.rope_parameters["mrope_interleaved"] is True
    assert tc.rope_parameters["rope_theta"] == 5_000_000
    assert cfg.tie_word_embeddings and tc.tie_word_embeddings
    assert (vc.depth, vc.hidden_size, vc.patch_size, vc.spatial_merge_size) == (24, 1024, 16, 2)
    assert vc.out_hidden_size == sh.hidden_size
    assert list(vc.deepstack_visual_indexes) == [5, 11, 17]
    assert (cfg.image_token_id, cfg.video_token_id) == (151655, 151656)
    assert (cfg.vision_start_token_id, cfg.vision_end_token_id) == (151652, 151653)
    assert tc.eos_token_id == 151645
    # Written in the public config.json's form: rope_scaling + rope_theta, which every reader knows.
    d = sh.config_dict()
    assert d["text_config"]["rope_scaling"]["mrope_section"] == [24, 20, 20]


def test_processor_config_is_qwen3_vl_like() -> None:
    p = gc.processor_config()
    assert (p["patch_size"], p["merge_size"], p["temporal_patch_size"]) == (16, 2, 2)
    assert p["image_mean"] == p["image_std"] == [0.5, 0.5, 0.5]
    assert p["size"] == {"shortest_edge": 65536, "longest_edge": 16777216}


def test_dry_run_prints_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    work = tmp_path / "work"
    rc = gc.main(["--shape", "2b", "--dry-run", "--json", str(out), "--work-dir", str(work),
                  "--port", "31234"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "2.13B parameters" in text
    assert "ssr_server.engine.sglang.server --model-path" in text
    assert "--port 31234 --dtype bfloat16 --mem-fraction-static 0.8" in text
    assert "generate 128 tokens" in text and "20 turns" in text
    plan = json.loads(out.read_text())
    assert plan["dry_run"] is True and [s["shape"] for s in plan["plan"]] == ["2b"]
    assert not work.exists()  # nothing built


def test_without_cuda_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    work = tmp_path / "work"
    rc = gc.main(["--shape", "2b", "--json", str(tmp_path / "r.json"), "--work-dir", str(work)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "--dry-run" in err
    assert not work.exists() and not (tmp_path / "r.json").exists()


def test_p95_and_summary() -> None:
    assert gc._p95([1.0]) == 1.0
    assert gc._p95([float(i) for i in range(1, 21)]) == pytest.approx(19.05)
    recs = [gc.TurnRecord(turn=t, compact_tokens=100 + 50 * t, context_tokens=200 + 50 * t, ssr_ms=10.0,
                          freeform_ms=640.0, selected=0, ssr_cached_tokens=200 + 50 * t - 1,
                          freeform_cached_tokens=(200 + 50 * (t - 1)) if t else 0,
                          freeform_prompt_tokens=200 + 50 * t, ssr_first=t % 2 == 0) for t in range(4)]
    s = gc.summarize(gc.Measurement(turns=recs, candidate_tokens=[30] * 6))
    assert s["reduction_pct"] == pytest.approx(100 * (1 - 10 / 640))
    assert s["decode_ms_per_token"] == pytest.approx(5.0)
    assert s["scoring_cost_decode_steps"] == pytest.approx(2.0)
    assert s["cache"]["ok"] is True
    recs[2].freeform_cached_tokens = 0  # a turn that found nothing cached
    assert gc.summarize(gc.Measurement(turns=recs))["cache"]["ok"] is False


def test_sharded_safetensors_with_index(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    state = {f"w{i}": torch.full((64,), float(i)) for i in range(5)}  # 256 bytes each
    gc._save_safetensors(state, tmp_path, max_shard_bytes=600)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 5 * 256
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    loaded: dict[str, Any] = {}
    for f in set(index["weight_map"].values()):
        loaded.update(load_file(str(tmp_path / f)))
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_tiny_shape_builds_loads_and_measures_on_cpu(tmp_path: Path) -> None:
    """The whole path but the GPU: build (real Qwen vocabulary), load with the Auto classes through the
    embedded engine, measure two turns. ``require_cuda=False`` is the self-test switch."""
    out = tmp_path / "r.json"
    r = gc.run_gpu_check([TINY], engine="torch", turns=2, warmup=0, freeform_tokens=2, json_path=str(out),
                         require_cuda=False, device="cpu", dtype="fp32", work_dir=str(tmp_path / "work"),
                         keep_models=True, log=lambda _: None)
    assert r["ok"] is True
    s = r["shapes"]["tiny"]
    assert s["turns"] == 2 and s["freeform_tokens"] == 2 and len(s["candidate_tokens"]) == 6
    assert s["context_tokens_last"] > s["context_tokens_first"] > 140  # image: 14 x 10 merged patches
    assert s["cache"]["ok"] is True
    checks = s["checks"]  # the embedded engine's correctness checks ran too
    assert checks["packed_vs_naive_max_abs_diff"] <= 1e-4 and checks["greedy_equal"] is True
    assert s["checks_ok"] is True
    model = tmp_path / "work" / "qwen3-vl-tiny"
    cfg = json.loads((model / "config.json").read_text())
    assert cfg["text_config"]["rope_scaling"]["mrope_section"] == [6, 5, 5]
    assert (model / "model.safetensors").exists() and (model / "tokenizer.json").exists()
    assert json.loads(out.read_text())["shapes"]["tiny"]["ssr"]["mean_ms"] > 0


def test_dry_run_rehearses_the_torch_check_on_cpu(tmp_path: Path) -> None:
    """``--dry-run`` with the embedded engine: the plan for the real shapes, then the whole check on a
    tiny stand-in (build, load, measure, packed-vs-naive and greedy-vs-generate), JSON written."""
    out = tmp_path / "r.json"
    r = gc.run_gpu_check(["2b"], engine="torch", turns=2, warmup=0, freeform_tokens=4, json_path=str(out),
                         dry_run=True, work_dir=str(tmp_path / "work"), log=lambda _: None)
    assert r["plan"][0]["params"] > 2e9  # the plan is for the real 2B shape
    rehearsal = r["rehearsal"]["shapes"]["2b"]
    assert rehearsal["params"] < 5e7 and rehearsal["turns"] == 2
    assert rehearsal["checks_ok"] is True and r["ok"] is True
    saved = json.loads(out.read_text())
    assert saved["dry_run"] is True and saved["rehearsal"]["shapes"]["2b"]["checks"]["greedy_equal"] is True

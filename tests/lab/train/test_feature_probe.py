"""``train probe-features``: the probes find what is there and only that; the drills' labels and pictures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ssr_lab.cli import app
from ssr_lab.train.feature_probe import probe_accuracy
from ssr_lab.world.closed_sets import CHARS, COLOURS


def _moving_token_task(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Noise tokens; the label is carried by ONE token at a random position (as a sign somewhere in a
    picture), so no fixed position and no mean over tokens gives it away cleanly."""
    gen = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(3, 16, generator=gen) * 3
    x = torch.randn(n, 12, 16, generator=gen)
    y = torch.randint(0, 3, (n,), generator=gen)
    where = torch.randint(0, 12, (n,), generator=gen)
    x[torch.arange(n), where] = prototypes[y] + 0.3 * torch.randn(n, 16, generator=gen)
    return x, y


def test_pooled_probe_reads_a_label_one_moving_token_carries_and_not_a_shuffled_one() -> None:
    x, y = _moving_token_task(300, seed=1)
    assert probe_accuracy(x, y, folds=3, steps=300, seed=0) > 0.9
    shuffled = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(2))]
    assert probe_accuracy(x, shuffled, folds=3, steps=300, seed=0) < 0.55  # chance is 1/3
    # padding is masked out of the pooling: a label carried only by padded positions is not read
    hidden = torch.randn(len(y), 12, 16, generator=torch.Generator().manual_seed(3))
    hidden[:, 6:] += 5 * y[:, None, None].float()
    pad = torch.zeros(hidden.shape[:2], dtype=torch.bool)
    pad[:, 6:] = True
    assert probe_accuracy(hidden, y, pad, folds=3, steps=300, seed=0) < 0.55
    assert probe_accuracy(hidden, y, folds=3, steps=300, seed=0) > 0.9  # unmasked, the same data is read


def test_linear_probe_on_vectors() -> None:
    gen = torch.Generator().manual_seed(4)
    y = torch.randint(0, 4, (200,), generator=gen)
    x = torch.randn(200, 8, generator=gen) + torch.nn.functional.one_hot(y, 8).float() * 5
    assert probe_accuracy(x, y, folds=4, steps=300, seed=0) > 0.9
    assert probe_accuracy(x, y, folds=4, steps=300, seed=0) == probe_accuracy(x, y, folds=4, steps=300,
                                                                             seed=0)  # seeded


@pytest.fixture(scope="module")
def trained(world_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ssr_lab.train import sft

    out = tmp_path_factory.mktemp("feature-probe") / "model"
    sft.train_sft(sft.SFTConfig(world=world_dir, out=out, init="64x1", steps=1, batch_size=2, limit=24,
                                warmup=1, threads=1, cache_examples=False), progress=False)
    return out


def test_feature_probe_labels_drills_with_their_answers_and_probes_each_attribute(
        world_dir: Path, trained: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ssr_lab.train import feature_probe
    from ssr_lab.train.feature_probe import FeatureProbeConfig, format_feature_probe, run_feature_probe

    seen: dict[str, feature_probe.Features] = {}
    collect = feature_probe.collect

    def recording(*args: object, **kwargs: object) -> feature_probe.Features:
        f = collect(*args, **kwargs)  # type: ignore[arg-type]
        seen[f"call{len(seen)}"] = f
        return f

    monkeypatch.setattr(feature_probe, "collect", recording)
    r = run_feature_probe(FeatureProbeConfig(world=world_dir, model=str(trained), split="train",
                                             attributes=("colour", "char", "plaque"), drills=12, folds=2,
                                             steps=3, threads=1, zoom="tight"))
    assert set(r["attributes"]) <= {"colour", "char", "plaque"} and "plaque" in r["attributes"]
    for row in r["attributes"].values():
        assert row["drills"] == 12 and 1 <= row["classes"] <= 12
        assert all(0.0 <= row[k] <= 1.0 for k in ("majority", "model", "picture", "answer"))
    by_attribute = dict(zip(r["attributes"], seen.values(), strict=True))
    if "colour" in by_attribute:
        assert set(by_attribute["colour"].labels) <= set(COLOURS)
    if "char" in by_attribute:
        assert set(by_attribute["char"].labels) <= set(CHARS)
    plaque = by_attribute["plaque"]
    assert all(p.dim() == 2 and p.shape[1] == plaque.answer.shape[1] for p in plaque.pictures)
    if "colour" in by_attribute:  # a detail drill reads its zoom crop, not a question picture
        question_sizes = {p.shape[0] for p in by_attribute["colour"].pictures}
        assert {p.shape[0] for p in plaque.pictures} != question_sizes
    majority = max(plaque.labels.count(a) for a in set(plaque.labels)) / 12
    assert r["attributes"]["plaque"]["majority"] == pytest.approx(majority)
    text = format_feature_probe(r)
    assert "plaque" in text and "picture" in text


def test_probe_features_command_refuses_bad_input(world_dir: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["train", "probe-features", "--world", str(tmp_path)])
    assert r.exit_code == 2 and "not a built world" in r.output
    r = CliRunner().invoke(app, ["train", "probe-features", "--world", str(world_dir), "--attribute",
                                 "weight", "--drills", "10", "--json", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "unknown attribute" in r.output
    assert not (tmp_path / "x.json").exists()


def test_probe_features_command_writes_its_figures(world_dir: Path, trained: Path, tmp_path: Path) -> None:
    import json

    out = tmp_path / "probe.json"
    args = ["train", "probe-features", "--world", str(world_dir), "--model", str(trained), "--split", "train",
            "--attribute", "plaque", "--drills", "10", "--folds", "2", "--steps", "2", "--zoom", "tight",
            "--zoom-jitter", "1.0", "--threads", "1", "--json", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    saved = json.loads(out.read_text())
    assert saved["zoom_jitter"] == 1.0 and list(saved["attributes"]) == ["plaque"]
    assert saved["attributes"]["plaque"]["drills"] == 10 and "plaque" in r.output

"""``train vision``: pictures drawn with their labels, masked pooling, the tower learns, the LM is kept."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ssr_lab.train.grow import grow_tower
from ssr_lab.train.vision import (
    EXTRA,
    KNOWN_LOOKS,
    LABELS,
    PLACES,
    PoolHead,
    TowerTrainer,
    VisionConfig,
    draw_pictures,
    place,
    reinit_tower,
    train_vision,
)
from ssr_lab.train.zoom_targets import question_picture
from ssr_lab.world.categories import MOTIFS
from ssr_lab.world.entities import draw_look
from ssr_lab.world.picture import PICTURE_SIZE
from ssr_server.engine.tiny import read_pixels


def test_pictures_are_question_views_and_zoom_crops_with_labels_in_range() -> None:
    pics = draw_pictures(12, random.Random(0))
    assert len(pics.views) == len(pics.crops) == 12
    assert all(v.size == PICTURE_SIZE for v in pics.views)
    assert all(min(c.size) >= 224 for c in pics.crops)  # the zoom tool's upscaled crop
    for key, classes in LABELS.items():
        assert pics.labels[key].shape == (12,)
        assert int(pics.labels[key].min()) >= 0 and int(pics.labels[key].max()) < len(classes)
    assert len(set(pics.labels["colour"].tolist())) > 1  # new looks, not one
    again = draw_pictures(12, random.Random(0))  # seeded: the same pictures
    assert all(a.tobytes() == b.tobytes() for a, b in zip(pics.views, again.views, strict=True))


def test_strip_style_pictures_are_the_same_views_with_whole_width_crops() -> None:
    tight = draw_pictures(6, random.Random(4))
    strip = draw_pictures(6, random.Random(4), zoom="strip")
    assert all(a.tobytes() == b.tobytes() for a, b in zip(tight.views, strip.views, strict=True))
    assert all(torch.equal(tight.labels[k], strip.labels[k]) for k in tight.labels)  # the plaque's places
    assert all(c.width > 4 * c.height for c in strip.crops)
    assert all(c.width < 2 * c.height for c in tight.crops)


def test_jittered_crops_move_sideways_while_the_views_and_labels_stay() -> None:
    look = draw_look(random.Random(6), sorted(MOTIFS)[0])
    rng, reference = random.Random(3), random.Random(3)
    question_picture(look, rng, "wide", 0.0)
    reference.getrandbits(63)  # the view's seed, the only draw: no jitter draws nothing more (old pictures)
    assert rng.getstate() == reference.getstate()
    moved = 0
    for seed in range(6):
        plain, jittered = (question_picture(look, random.Random(seed), "wide", j) for j in (0.0, 1.2))
        if plain is None or jittered is None:
            continue
        assert plain[0].tobytes() == jittered[0].tobytes() and plain[1] == jittered[1]  # view, gold box
        # the same wide crop, elsewhere (its size up to a pixel's rounding of the box's edges, magnified)
        assert all(abs(a - b) <= a / 20 for a, b in zip(plain[2].size, jittered[2].size, strict=True))
        moved += plain[2].tobytes() != jittered[2].tobytes()
    assert moved >= 3


def test_a_known_share_draws_well_known_looks_labelled_by_entity() -> None:
    plain = draw_pictures(16, random.Random(3))
    assert plain.labels["known"].tolist() == [0] * 16  # "unknown"
    known = draw_pictures(16, random.Random(3), known_share=1.0)
    ids = [EXTRA["known"][i] for i in known.labels["known"].tolist()]
    assert all(i in KNOWN_LOOKS for i in ids) and len(set(ids)) > 1
    colours = [LABELS["colour"][i] for i in known.labels["colour"].tolist()]
    assert colours == [KNOWN_LOOKS[i].colour for i in ids]  # the entity's own look, in a fresh view
    assert known.labels["count_mean"].tolist() == known.labels["count"].tolist()


def test_the_place_heads_label_the_tenth_holding_the_gold_boxs_centre() -> None:
    assert [place(c) for c in (0, 99.9, 100, 541, 999, 1000)] == [PLACES[i] for i in (0, 0, 1, 5, 9, 9)]
    rng = random.Random(5)
    pics = draw_pictures(8, rng)
    again = random.Random(5)
    for i in range(8):
        drawn = None
        while drawn is None:  # draw_pictures skips the looks whose plaque fell outside the view
            look = draw_look(again, again.choice(sorted(MOTIFS)))
            drawn = question_picture(look, again)
        _, box, _ = drawn
        assert EXTRA["plaque_x"][int(pics.labels["plaque_x"][i])] == place((box[0] + box[2]) / 2)
        assert EXTRA["plaque_y"][int(pics.labels["plaque_y"][i])] == place((box[1] + box[3]) / 2)
    assert len(set(pics.labels["plaque_x"].tolist())) > 1  # plaques stand anywhere left to right


def test_a_mean_head_averages_the_real_tokens() -> None:
    torch.manual_seed(0)
    head = PoolHead(8, 3, mean=True)
    feats = torch.randn(1, 5, 8)
    mask = torch.tensor([[True, True, True, False, False]])
    want = head.out(head.norm(feats[0, :3]).mean(0))
    assert torch.allclose(head(feats, mask)[0], want, atol=1e-6)


def test_padding_tokens_do_not_change_a_heads_output() -> None:
    torch.manual_seed(0)
    head = PoolHead(8, 3)
    feats = torch.randn(2, 5, 8)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    out = head(feats, mask)
    feats[1, 3:] = 1e3  # garbage in the padding
    assert torch.allclose(head(feats, mask), out)


def test_the_tower_fits_a_fixed_batch(tiny_model_dir: Path) -> None:
    from transformers import AutoImageProcessor

    from ssr_lab.train.setup import load_model

    torch.manual_seed(0)
    model, _ = load_model(tiny_model_dir)
    trainer = TowerTrainer(model, AutoImageProcessor.from_pretrained(tiny_model_dir, backend="pil"))
    pics = draw_pictures(8, random.Random(1))
    opt = torch.optim.AdamW([*trainer.tower.parameters(), *trainer.heads.parameters()], lr=3e-3)
    first = None
    for _ in range(40):
        loss, _ = trainer.loss(pics)
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    final, accuracy = trainer.loss(pics)
    assert float(final.detach()) < 0.5 * first, (first, float(final.detach()))
    assert accuracy["colour"] > 0.5


def test_train_vision_changes_the_tower_only_and_writes_a_card(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "vision"
    figures = train_vision(VisionConfig(init=tiny_model_dir, out=out, steps=3, batch_size=4, threads=1,
                                        eval_pictures=8, reinit=True), progress=False)
    assert figures["steps"] == 3 and set(LABELS) <= {k.split(".", 1)[1] for k in figures if "accuracy." in k}
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    assert before.keys() == after.keys()  # the heads are not kept
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".visual." in k for k in changed), sorted(changed)[:5]
    assert "train vision" in (out / "README.md").read_text()
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 0  # log_every 25 > 3 steps
    assert json.loads((out / "ssr_tiny.json").read_text())["trained"] == "vision"


def test_train_vision_with_the_extra_heads(tiny_model_dir: Path, tmp_path: Path) -> None:
    figures = train_vision(VisionConfig(init=tiny_model_dir, out=tmp_path / "v", steps=2, batch_size=4,
                                        threads=1, eval_pictures=4, known_share=0.5,
                                        heads=("count_mean", "known", "plaque_x", "plaque_y")),
                           progress=False)
    assert {k for k in figures if k.startswith("accuracy.")} == {
        "accuracy.count_mean", "accuracy.known", "accuracy.plaque_x", "accuracy.plaque_y"}
    assert figures["steps"] == 2


def test_image_pixels_trains_at_that_size_and_the_model_keeps_it(tiny_model_dir: Path,
                                                                  tmp_path: Path) -> None:
    from transformers import AutoImageProcessor

    out = tmp_path / "v"
    train_vision(VisionConfig(init=tiny_model_dir, out=out, steps=1, batch_size=2, threads=1, eval_pictures=2,
                              image_pixels=448 * 320), progress=False)
    assert read_pixels(out) == (448 * 320, 448 * 320) != read_pixels(tiny_model_dir)
    picture = question_picture(draw_look(random.Random(0), sorted(MOTIFS)[0]), random.Random(1))
    assert picture is not None
    grid = AutoImageProcessor.from_pretrained(out, backend="pil")(images=[picture[0]], return_tensors="pt")
    assert int(grid["image_grid_thw"].prod()) == 4 * PICTURE_SIZE[0] * PICTURE_SIZE[1] // 16 ** 2


def test_max_pixels_keeps_question_pictures_and_gives_a_strip_crop_more_tokens(tiny_model_dir: Path,
                                                                              tmp_path: Path) -> None:
    from transformers import AutoImageProcessor

    out = tmp_path / "v"
    train_vision(VisionConfig(init=tiny_model_dir, out=out, steps=1, batch_size=2, threads=1, eval_pictures=2,
                              max_pixels=2 * 65536, zoom="strip"), progress=False)
    assert read_pixels(out) == (read_pixels(tiny_model_dir)[0], 2 * 65536)
    pics = draw_pictures(1, random.Random(1), zoom="strip")
    before = AutoImageProcessor.from_pretrained(tiny_model_dir, backend="pil")
    after = AutoImageProcessor.from_pretrained(out, backend="pil")
    for image, grows in ((pics.views[0], False), (pics.crops[0], True)):
        old, new = (int(proc(images=[image], return_tensors="pt")["image_grid_thw"].prod())
                    for proc in (before, after))
        assert (new > old) == grows and new >= old


def test_the_anchor_measures_drift_from_the_initial_tower(tiny_model_dir: Path) -> None:
    from transformers import AutoImageProcessor

    from ssr_lab.train.setup import load_model

    model, _ = load_model(tiny_model_dir)
    trainer = TowerTrainer(model, AutoImageProcessor.from_pretrained(tiny_model_dir, backend="pil"),
                           ("colour",), anchor=1.0)
    pics = draw_pictures(4, random.Random(2))
    _, accuracy = trainer.loss(pics)
    assert accuracy["drift"] == 0.0  # the same weights
    with torch.no_grad():
        for p in trainer.tower.parameters():
            p.add_(0.01 * torch.randn_like(p))
    _, accuracy = trainer.loss(pics)
    assert accuracy["drift"] > 0.0
    assert trainer.frozen is not None and not any(p.requires_grad for p in trainer.frozen.parameters())


def test_crops_can_be_anchored_apart_from_the_views(tiny_model_dir: Path) -> None:
    from transformers import AutoImageProcessor

    from ssr_lab.train.setup import load_model

    model, _ = load_model(tiny_model_dir)
    processor = AutoImageProcessor.from_pretrained(tiny_model_dir, backend="pil")
    pics = draw_pictures(4, random.Random(3))
    free = TowerTrainer(model, processor, ("colour",), anchor=2.0, anchor_crops=0.0)
    with torch.no_grad():
        for p in free.tower.parameters():
            p.add_(0.01 * torch.randn_like(p))
    loss, accuracy = free.loss(pics)
    assert accuracy["drift"] > 0.0 and accuracy["drift_crops"] > 0.0  # both measured...
    both = TowerTrainer(model, processor, ("colour",), anchor=2.0, anchor_crops=3.0)
    both.frozen, both.heads = free.frozen, free.heads  # the same start and head: only the weights differ
    loss_both, _ = both.loss(pics)
    # ...but only the views' drift weighs on the loss unless the crops get a weight of their own
    assert float((loss_both - loss).detach()) == pytest.approx(3.0 * accuracy["drift_crops"], rel=1e-4)


def test_a_step_runs_the_tower_only_on_the_streams_its_heads_read(tiny_model_dir: Path) -> None:
    from transformers import AutoImageProcessor

    from ssr_lab.train.setup import load_model

    model, _ = load_model(tiny_model_dir)
    processor = AutoImageProcessor.from_pretrained(tiny_model_dir, backend="pil")
    pics = draw_pictures(3, random.Random(4))
    calls: list[int] = []
    model.model.visual.register_forward_hook(lambda _m, _i, out: calls.append(len(out.pooler_output)))
    for heads, passes in ((("colour", "sign"), 1), (("colour", "plaque"), 2)):
        calls.clear()
        TowerTrainer(model, processor, heads).loss(pics)
        assert len(calls) == passes, heads
    calls.clear()
    TowerTrainer(model, processor, ("colour",), anchor=1.0).loss(pics)
    assert len(calls) == 4  # anchored: views and crops, each through the tower and its frozen copy


def test_unknown_heads_are_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown heads"):
        train_vision(VisionConfig(init=tiny_model_dir, out=tmp_path / "w", steps=1, heads=("size",)),
                     progress=False)


def test_reinit_gives_fresh_weights(tiny_model_dir: Path) -> None:
    from ssr_lab.train.setup import load_model

    model, _ = load_model(tiny_model_dir)
    tower = model.model.visual
    reinit_tower(tower, torch.Generator().manual_seed(0))
    params = dict(tower.named_parameters())
    norms = [n for n in params if "norm" in n and n.endswith("weight")]
    assert norms and all(torch.all(params[n] == 1) for n in norms)
    deep = [n for n in params if n.startswith("deepstack_merger_list.") and ".linear_fc2." in n]
    assert deep and all(torch.all(params[n] == 0) for n in deep)  # the deepstack branches start silent
    assert float(params["merger.linear_fc2.weight"].detach().std()) > 0.01


def test_grown_blocks_start_as_the_identity_then_learn(tiny_model_dir: Path) -> None:
    from transformers import AutoImageProcessor

    from ssr_lab.train.setup import load_model

    torch.manual_seed(0)
    model, _ = load_model(tiny_model_dir)
    trainer = TowerTrainer(model, AutoImageProcessor.from_pretrained(tiny_model_dir, backend="pil"))
    batch = trainer.pixels(draw_pictures(3, random.Random(2)).views)
    grid = batch["image_grid_thw"]
    tower = trainer.tower
    with torch.no_grad():
        before = tower(batch["pixel_values"], grid_thw=grid)
    depth = len(tower.blocks)
    grow_tower(model, 2)
    assert len(tower.blocks) == depth + 2 == model.config.vision_config.depth
    with torch.no_grad():
        after = tower(batch["pixel_values"], grid_thw=grid)
    assert torch.equal(before.pooler_output, after.pooler_output)  # the tokens the LM reads
    for a, b in zip(before.deepstack_features, after.deepstack_features, strict=True):
        assert torch.equal(a, b)
    # not stuck at the identity: the zeroed projections get gradients from the first step
    loss, _ = trainer.loss(draw_pictures(4, random.Random(3)))
    loss.backward()  # type: ignore[no-untyped-call]
    grad = tower.blocks[-1].mlp.linear_fc2.weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0


def test_train_vision_grow_saves_a_deeper_tower_that_loads(tiny_model_dir: Path, tmp_path: Path) -> None:
    from ssr_lab.train.setup import load_model

    out = tmp_path / "grown"
    train_vision(VisionConfig(init=tiny_model_dir, out=out, steps=2, batch_size=4, threads=1,
                              eval_pictures=4, grow=1, heads=("colour",)), progress=False)
    depth = json.loads((tiny_model_dir / "config.json").read_text())["vision_config"]["depth"]
    assert json.loads((out / "config.json").read_text())["vision_config"]["depth"] == depth + 1
    saved = load_file(str(out / "model.safetensors"))
    assert any(k.endswith(f"visual.blocks.{depth}.attn.proj.weight") for k in saved)
    model, _ = load_model(out)  # the new blocks load as trained, not as fresh weights
    key = next(k for k in saved if k.endswith(f"visual.blocks.{depth}.mlp.linear_fc2.weight"))
    loaded = dict(model.named_parameters())
    name = next(n for n in loaded if n.endswith(f"visual.blocks.{depth}.mlp.linear_fc2.weight"))
    assert torch.equal(loaded[name].detach(), saved[key])

"""``ssr-lab train sft``: a short real run whose loss falls, resumable, loadable by every engine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from ssr_lab.train.data import Collator, assistant_mask, shared_prefix, token_logits
from ssr_lab.train.sft import SFTConfig, train_sft
from ssr_server.engine.tiny import DEFAULT_PIXELS, read_pixels, write_processor_config


def test_assistant_mask_covers_assistant_turns_only() -> None:
    ids = [1, 9, 9, 5, 6, 7, 2, 3, 1, 9, 9, 8, 2]  # 1 9 9: "<|im_start|>assistant\n", 2: "<|im_end|>"
    want = (False, False, False, True, True, True, True, False, False, False, False, True, True)
    assert assistant_mask(ids, [1, 9, 9], 2) == want
    assert assistant_mask([4, 5, 6], [1, 9, 9], 2) == (False,) * 3


def test_shared_prefix_stops_before_images_differences_and_predictions() -> None:
    a, b = [1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9, 9]
    no = (False,) * 6
    assert shared_prefix([a, b], [no, no], image_token=99) == 3
    assert shared_prefix([a, a], [no, (False, False, True, True, False, False)], 99) == 1  # before q - 1 = 1
    assert shared_prefix([[1, 99, 3, 4], [1, 99, 3, 5]], [no[:4], no[:4]], 99) == 1  # never an image
    assert shared_prefix([a], [no], 99) == 5  # the rest keeps a token


def test_the_shared_prefix_batch_equals_full_forwards(world_dir: Path, tiny_model_dir: Path) -> None:
    """The training loss with the system prompt run once per batch is the loss of B full forwards."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    from ssr_lab.train.setup import oracle_examples
    from ssr_lab.world import load_questions
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).eval()
    qs = [q for q in load_questions(world_dir / "questions.jsonl") if q.split == "train"]
    picked = [next(q for q in qs if q.kind == k) for k in ("search", "visual", "detail", "knowledge")]
    examples, dropped = asyncio.run(oracle_examples(world_dir, picked, tok, get_format(),
                                                    LibraryRegistry().get("default"), "ssr", progress=False))
    assert dropped == 0 and len(examples) == 4
    collate = Collator(model, AutoImageProcessor.from_pretrained(tiny_model_dir, backend="pil"), 0)
    batch = collate(examples)
    assert batch.prefix.shape[1] > 300  # the system prompt, shared
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(token_logits(model, batch), batch.targets, reduction="sum")
        want, n = 0.0, 0
        for ex in examples:
            ids, mask, pixels, grids = collate.expand(ex)
            full = torch.tensor([ids])
            logits = model(input_ids=full, pixel_values=torch.cat(pixels), image_grid_thw=torch.cat(grids),
                           mm_token_type_ids=(full == model.config.image_token_id).int()).logits[0].float()
            q = torch.tensor([i for i in range(1, len(ids)) if mask[i]])
            want += float(torch.nn.functional.cross_entropy(logits[q - 1], full[0, q], reduction="sum"))
            n += len(q)
    assert batch.predicted == n
    assert float(loss) == pytest.approx(want, rel=1e-4)


@pytest.mark.slow
def test_a_short_sft_run_learns_and_resumes(world_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "model"
    cfg = SFTConfig(world=world_dir, out=out, init="64x2", steps=24, batch_size=4, lr=3e-3, warmup=4,
                    limit=48, save_every=12, log_every=1, threads=1)
    first = train_sft(cfg, progress=False)
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 25))
    early = sum(r["loss"] for r in log[:4]) / 4
    late = sum(r["loss"] for r in log[-4:]) / 4
    assert late < early - 0.5, (early, late)  # it learns (a fall, not a time)
    assert first["steps"] == 24 and first["dropped_trajectories"] == 0
    card = (out / "README.md").read_text()
    assert "ssr-lab" in card and "## Reproduce" in card
    # resuming: a longer schedule continues from the last checkpoint, not from step 0
    train_sft(SFTConfig(**{**cfg.__dict__, "steps": 30}), progress=False)
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log][24:] == list(range(25, 31))
    # the result loads where it will be served: transformers and the embedded engine
    from transformers import AutoModelForImageTextToText

    from ssr_server.engine.torch.engine import TorchEngine

    AutoModelForImageTextToText.from_pretrained(out)
    engine = TorchEngine(str(out))
    asyncio.run(engine.close())


def test_annealing_by_time_puts_a_run_its_budget_cuts_at_the_floor(world_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "model"
    # a budget spent before the first step: the run stops after it, its rate already at the floor
    cfg = SFTConfig(world=world_dir, out=out, init="64x1", steps=24, lr=3e-3, warmup=4, min_lr_ratio=0.1,
                    batch_size=4, limit=16, log_every=1, threads=1, max_minutes=1e-9, anneal_by_time=True)
    assert train_sft(cfg, progress=False)["stopped_at_time_budget"]
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1] and log[0]["lr"] == pytest.approx(3e-4)


def test_freezing_the_vision_tower_trains_the_language_model_only(world_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText

    out = tmp_path / "model"
    base = SFTConfig(world=world_dir, out=tmp_path / "base", init="64x1", steps=1, batch_size=4, limit=16,
                     threads=1, warmup=1)
    train_sft(base, progress=False)
    figures = train_sft(SFTConfig(**{**base.__dict__, "out": out, "init": str(base.out), "steps": 3,
                                     "lr": 1e-2, "freeze_vision": True, "pictures_every": 2,
                                     "pictures_batch": 4}), progress=False)
    before = AutoModelForImageTextToText.from_pretrained(base.out).state_dict()
    after = AutoModelForImageTextToText.from_pretrained(out).state_dict()
    tower = [k for k in before if ".visual." in k]
    rest = [k for k in before if ".visual." not in k and before[k].is_floating_point()]
    assert tower and rest and figures["trained_parameters"] < figures["parameters"]
    assert all(torch.equal(before[k], after[k]) for k in tower)  # picture batches ran: it had gradients
    assert sum(not torch.equal(before[k], after[k]) for k in rest) > len(rest) // 2


def test_a_tower_trained_at_a_share_of_the_rate_moves_that_much_less(world_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText

    base = SFTConfig(world=world_dir, out=tmp_path / "base", init="64x1", steps=1, batch_size=4, limit=16,
                     threads=1, warmup=1)
    train_sft(base, progress=False)
    out = tmp_path / "model"
    train_sft(SFTConfig(**{**base.__dict__, "out": out, "init": str(base.out), "steps": 3, "lr": 1e-2,
                           "vision_lr_scale": 0.05, "pictures_every": 2, "pictures_batch": 4}),
              progress=False)
    before = AutoModelForImageTextToText.from_pretrained(base.out).state_dict()
    after = AutoModelForImageTextToText.from_pretrained(out).state_dict()
    moved = {k: float((after[k] - before[k]).abs().max()) for k in before if before[k].is_floating_point()}
    tower = max(v for k, v in moved.items() if ".visual." in k)
    rest = max(v for k, v in moved.items() if ".visual." not in k)
    # AdamW moves a weight by about its rate a step whatever its gradient's size: a twentieth, give or take
    assert 0 < tower < 0.2 * rest


def test_a_run_from_a_model_folder_keeps_its_picture_size(world_dir: Path, tmp_path: Path) -> None:
    base = SFTConfig(world=world_dir, out=tmp_path / "base", init="64x1", steps=1, batch_size=2, limit=8,
                     threads=1, warmup=1)
    train_sft(base, progress=False)
    assert read_pixels(base.out) == DEFAULT_PIXELS  # a fresh shape sees pictures at the default size
    write_processor_config(base.out, (8192, 16384))  # as `train vision --image-pixels` leaves a tower
    out = tmp_path / "model"
    train_sft(SFTConfig(**{**base.__dict__, "out": out, "init": str(base.out), "save_every": 1}),
              progress=False)
    assert read_pixels(out) == (8192, 16384)
    assert all(read_pixels(c) == (8192, 16384) for c in (out / "checkpoints").glob("step-*"))


def test_the_example_cache_returns_the_replay_and_is_keyed_by_its_inputs(
        world_dir: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    import shutil

    from transformers import AutoTokenizer

    from ssr_lab.train.setup import oracle_examples
    from ssr_lab.world import load_questions
    from ssr_server.core.formats.format import get_format
    from ssr_server.core.library import LibraryRegistry

    world = tmp_path / "world"
    shutil.copytree(world_dir, world, ignore=shutil.ignore_patterns(".cache"))  # other tests' caches
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    fmt, library = get_format(), LibraryRegistry().get("default")
    qs = [q for q in load_questions(world / "questions.jsonl") if q.split == "train"][:3]

    def run(questions: list, label_only: bool = False) -> tuple:  # type: ignore[type-arg]
        return asyncio.run(oracle_examples(world, questions, tok, fmt, library, "ssr", progress=False,
                                           label_only=label_only, cache=True))

    fresh = run(qs)
    files = sorted((world / ".cache").glob("examples-ssr-*.pkl"))
    assert len(files) == 1
    stamp = files[0].stat().st_mtime_ns
    assert run(qs) == fresh and files[0].stat().st_mtime_ns == stamp  # a hit: read, not replayed
    # what the examples depend on is in the key: other questions, index labels -> other files
    assert run(qs[:2])[0] == fresh[0][:2]
    run(qs, label_only=True)
    assert len(list((world / ".cache").glob("examples-ssr-*.pkl"))) == 3


def test_repeat_puts_a_kind_n_times_in_each_epoch(world_dir: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`train sft --repeat visual=3`: over one epoch the collator sees each visual trajectory three times
    and every other one once."""
    from collections import Counter
    from collections.abc import Sequence
    from typing import Any

    from ssr_lab.train import sft
    from ssr_lab.train.setup import split_questions
    from ssr_lab.world import load_questions

    drawn: list[str] = []

    class Recording(sft.Collator):
        def __call__(self, examples: Sequence[Any]) -> Any:
            drawn.extend(e.key.split("/", 1)[0] for e in examples)
            return super().__call__(examples)

    monkeypatch.setattr(sft, "Collator", Recording)
    chosen = split_questions(load_questions(world_dir / "questions.jsonl"), "train", 24, 0)
    kinds = {q.id: q.kind for q in chosen}
    visual = sum(k == "visual" for k in kinds.values())
    assert 0 < visual < len(kinds)
    pool = len(kinds) + 2 * visual
    sft.train_sft(SFTConfig(world=world_dir, out=tmp_path / "repeat", init="64x1", steps=-(-pool // 4),
                            batch_size=4, limit=24, warmup=1, threads=1, cache_examples=False,
                            repeat=(("visual", 3),)), progress=False)
    seen = Counter(drawn)  # one epoch exactly: ceil(pool / 4) batches
    assert set(seen) == set(kinds)
    assert all(n == (3 if kinds[q] == "visual" else 1) for q, n in seen.items()), seen

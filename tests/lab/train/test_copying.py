"""The synthetic copying task: its rows, its loss, the widening curriculum and its place in `train sft`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from ssr_lab.train.copying import CopyTask, copy_loss
from ssr_lab.train.data import Example


def _model(hidden: int = 64, layers: int = 2) -> Any:
    from ssr_server.engine.tiny import TinyShape, build_tokenizer, make_config

    shape = TinyShape.parse(f"{hidden}x{layers}-tied")
    tok = build_tokenizer("trained", shape)
    torch.manual_seed(0)
    from transformers import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration(make_config(tok, shape)), tok


def test_a_row_repeats_its_span_after_the_filler_and_uses_ordinary_ids() -> None:
    task = CopyTask(vocab=100)
    ids, n, f = task.rows(5, torch.Generator().manual_seed(0))
    assert ids.shape == (5, 2 * n + f)
    assert torch.equal(ids[:, :n], ids[:, n + f :])
    assert int(ids.max()) < 100 and int(ids.min()) >= 0
    assert 16 <= n <= 32 and 16 <= f <= 48


def test_the_lengths_widen_from_the_start_to_the_full_ranges() -> None:
    task = CopyTask(vocab=100)
    assert task.ranges(0.0) == ((24, 24), (40, 40))
    assert task.ranges(1.0) == ((16, 32), (16, 48)) == task.ranges(3.0)
    (s_lo, s_hi), (f_lo, f_hi) = task.ranges(0.5)
    assert (s_lo, s_hi, f_lo, f_hi) == (20, 28, 28, 44)
    seen = {task.rows(2, torch.Generator().manual_seed(k), widened=0.0)[1:] for k in range(10)}
    assert seen == {(24, 40)}
    assert len({task.rows(2, torch.Generator().manual_seed(k))[1:] for k in range(30)}) > 10


def test_for_tokenizer_stops_before_the_added_tokens() -> None:
    _, tok = _model()
    task = CopyTask.for_tokenizer(tok)
    added = tok.get_added_vocab().values()
    assert task.vocab == min(added) and all(i < min(added) for i in range(task.vocab))


def test_the_loss_is_the_cross_entropy_of_the_repeat_after_its_first_token() -> None:
    model, tok = _model()
    task = CopyTask.for_tokenizer(tok)
    with torch.no_grad():
        loss, tokens = copy_loss(model, task, 3, torch.Generator().manual_seed(7))
        ids, n, f = task.rows(3, torch.Generator().manual_seed(7))
        logits = model(input_ids=ids).logits.float()  # a plain full forward: text positions 0..T-1
        start = n + f
        want = torch.nn.functional.cross_entropy(logits[:, start:-1].reshape(-1, logits.shape[-1]),
                                                 ids[:, start + 1 :].reshape(-1))
    assert tokens == 3 * ids.shape[1]
    assert float(loss) == pytest.approx(float(want), rel=1e-5)


@pytest.mark.slow
def test_a_fresh_model_learns_the_task_at_one_length() -> None:
    """A fall, not a time: a 64x2 model copies spans of one length after 200 steps (chance is ~8)."""
    model, tok = _model()
    task = CopyTask.for_tokenizer(tok)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    first = None
    for _ in range(200):
        loss, _ = copy_loss(model, task, 32, g, widened=0.0)
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first is not None and first > 5.0
    with torch.no_grad():
        final, _ = copy_loss(model, task, 32, torch.Generator().manual_seed(99), widened=0.0)
    assert float(final) < 1.0, (first, float(final))


def test_sft_runs_the_copying_steps_where_the_schedule_puts_them(world_dir: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm-up steps first, then every Nth step: the collator (SFT batches) is called for the others only,
    and the run logs every step."""
    import json

    from ssr_lab.train import sft, sft_loop
    from ssr_lab.train.data import Collator

    collated: list[int] = []

    class Recording(Collator):
        def __call__(self, examples: Sequence[Example]) -> Any:
            collated.append(len(examples))
            return super().__call__(examples)

    copied: list[int] = []
    real = sft_loop.copy_loss  # the loop's step runs the copying task

    def recording_copy(*args: Any, **kwargs: Any) -> Any:
        copied.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sft, "Collator", Recording)
    monkeypatch.setattr(sft_loop, "copy_loss", recording_copy)
    out = tmp_path / "copy"
    figures = sft.train_sft(sft.SFTConfig(world=world_dir, out=out, init="64x1", steps=8, batch_size=2,
                                          limit=16, warmup=1, threads=1, copy_every=3, copy_warmup=2,
                                          copy_batch=4, log_every=1, cache_examples=False), progress=False)
    # C C R R C R R C: two warm-up steps, then one copying step after every two SFT batches
    assert len(copied) == 4 and len(collated) == 4 == 8 - figures["copy_steps_planned"]
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 9))

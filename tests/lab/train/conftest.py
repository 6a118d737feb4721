"""Shared fixtures of the training tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ssr_lab.train.data import Example


@pytest.fixture
def sft_batches(monkeypatch: pytest.MonkeyPatch) -> list[list[Example]]:
    """Every batch `train_sft` collates from now on, in order (its Collator, recording)."""
    from ssr_lab.train import sft
    from ssr_lab.train.data import Collator

    batches: list[list[Example]] = []

    class Recording(Collator):
        def __call__(self, examples: Sequence[Example]) -> Any:
            batches.append(list(examples))
            return super().__call__(examples)

    monkeypatch.setattr(sft, "Collator", Recording)
    return batches

"""Train/dev/test splits by entity: every question about an invented entity lands in its entity's split.

Keys (the build uses name stems, so that near-namesakes share a split) are ordered by a seeded hash and
cut into test, dev and train, so the test split holds entities no training question mentions, nor
does any training search turn up their documents by name (knowledge entities are the exception: they
are asked about in every split, since their facts are meant to be learned).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

DEV_SHARE = 0.1
TEST_SHARE = 0.1


def assign_splits(keys: Sequence[str], seed: int) -> dict[str, str]:
    """Key -> "train" | "dev" | "test"; with 3 or more keys every split gets at least one."""
    order = sorted(keys, key=lambda i: hashlib.sha256(f"{seed}/split/{i}".encode()).digest())
    n = len(order)
    n_test = max(1, round(n * TEST_SHARE)) if n >= 3 else 0
    n_dev = max(1, round(n * DEV_SHARE)) if n >= 3 else 0
    out = {}
    for rank, key in enumerate(order):
        out[key] = "test" if rank < n_test else "dev" if rank < n_test + n_dev else "train"
    return out

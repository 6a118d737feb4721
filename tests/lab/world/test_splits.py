"""Splits by entity (knowledge entities aside) and partly by phrasing."""

from __future__ import annotations

from collections import defaultdict

from ssr_lab.world import SPLITS, Question
from ssr_lab.world.splits import assign_splits


def test_invented_entities_never_cross_splits(questions: list[Question]) -> None:
    splits_of: dict[str, set[str]] = defaultdict(set)
    for q in questions:
        if q.kind != "knowledge":
            splits_of[q.entity_id].add(q.split)
    assert all(len(s) == 1 for s in splits_of.values())
    by_split = {s: {e for e, ss in splits_of.items() if s in ss} for s in SPLITS}
    assert all(by_split.values())
    assert not by_split["test"] & by_split["train"] and not by_split["dev"] & by_split["train"]
    assert not by_split["test"] & by_split["dev"]
    assert len(by_split["train"]) > 6 * len(by_split["test"])


def test_near_namesakes_share_a_split(questions: list[Question]) -> None:
    split_of = {q.entity: q.split for q in questions if q.kind != "knowledge"}
    stems: dict[str, set[str]] = defaultdict(set)
    for title, split in split_of.items():
        stems[title.split()[0]].add(split)
    assert len(stems) < len(split_of)  # some stems are shared
    assert all(len(s) == 1 for s in stems.values())


def test_knowledge_entities_are_asked_in_every_split(questions: list[Question]) -> None:
    knowledge = [q for q in questions if q.kind == "knowledge"]
    assert {q.split for q in knowledge} == set(SPLITS)
    assert all(q.entity_id.startswith("k-") for q in knowledge)
    assert not any(q.entity_id.startswith("k-") for q in questions if q.kind != "knowledge")


def test_held_out_phrasings_only_in_test(questions: list[Question]) -> None:
    held = [q for q in questions if q.heldout_template]
    assert held and {q.split for q in held} == {"test"}
    test_templates = {q.template for q in questions if q.split == "test"}
    train_templates = {q.template for q in questions if q.split == "train"}
    assert test_templates - train_templates  # some test phrasing is never seen in training


def test_assignment_is_stable_and_small_worlds_fill_every_split() -> None:
    ids = [f"e{i}" for i in range(3)]
    assert sorted(assign_splits(ids, 1).values()) == ["dev", "test", "train"]
    assert assign_splits(ids, 1) == assign_splits(list(reversed(ids)), 1)  # order does not matter

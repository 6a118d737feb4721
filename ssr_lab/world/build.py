"""``build_world``: entities, corpus, questions, pictures and views, calibrated and written to a folder.

Layout of the folder (what ``build_registry(corpus_path=..., image_index_dir=...)`` serves as is):

* ``corpus.jsonl``: ``{"id", "title", "text", "url"}`` per line (``LocalBM25.from_jsonl``);
* ``images/``: one PNG per entity and ``index.json`` ``{"hash_kind", "images": [{"id", "file", "title",
  "description", "url", "phash", "dhash"}]}`` (``LocalImageIndex``; the hashes make loading fast);
* ``views/``: one JPEG per question, the question image;
* ``questions.jsonl``: one ``records.Question`` per line, all splits;
* ``manifest.json``: seed, counts per split and kind, calibration figures and a fingerprint of every
  other file. No timings: the same seed gives the same bytes in every file.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ssr_lab.world.calibrate import ImageCheck, check_view, text_hits
from ssr_lab.world.corpus import build_corpus
from ssr_lab.world.entities import Entity, generate_entities
from ssr_lab.world.knowledge import knowledge_entities, knowledge_words
from ssr_lab.world.names import fixed_names
from ssr_lab.world.questions import plan_questions
from ssr_lab.world.records import Question, WorldError, validate
from ssr_lab.world.render import Rendered, RenderedView, RenderJob, render_batch, write_atomic
from ssr_lab.world.report import BuildReport, count_questions
from ssr_lab.world.splits import assign_splits
from ssr_lab.world.views import zoom_box
from ssr_server.core.errors import InvalidRequest
from ssr_server.tools.demo import fingerprint
from ssr_server.tools.image_search import LocalImageIndex
from ssr_server.tools.text_search import LocalBM25

WORLD_VERSION = 1  # bump when anything changes the bytes a seed produces
TEXT_K = 5  # hits the text search tool shows (build_registry's text_k)
MAX_VIEW_ATTEMPTS = 50
CHUNK = 24  # entities per worker task
HASH_KIND = "imagehash-phash8-dhash8"  # what the "phash"/"dhash" fields of images/index.json hold


class _Runner:
    """Renders job batches in process, or in a spawn pool (safe even where torch's threads exist).

    ``start`` returns at once when there is a pool, so the caller can do other work (the text search
    calibration) while the workers draw; the returned function waits and gives results in job order.
    """

    def __init__(self, processes: int) -> None:
        self.pool = multiprocessing.get_context("spawn").Pool(processes) if processes > 1 else None

    def __enter__(self) -> _Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.terminate()  # every result has been collected by then
            self.pool.join()

    def start(self, jobs: Sequence[RenderJob], bar: tqdm[Any]) -> Callable[[], list[Rendered]]:
        chunks = [list(jobs[i:i + CHUNK]) for i in range(0, len(jobs), CHUNK)]
        if self.pool is None:
            def inline() -> list[Rendered]:
                out = []
                for chunk in chunks:
                    out.extend(render_batch(chunk))
                    bar.update(len(chunk))
                return out

            return inline
        pending = [self.pool.apply_async(render_batch, (c,), callback=lambda r: bar.update(len(r)))
                   for c in chunks]
        return lambda: [r for p in pending for r in p.get()]


def _calibrate_text(questions: list[Question], docs: list[dict[str, str]]
                    ) -> tuple[list[Question], dict[str, Any]]:
    """Drop questions whose gold query misses its document (none, in practice); figures for the manifest."""
    bm25 = LocalBM25(docs)
    moves = [(q, m, m is [x for x in q.moves if x.action == "text_search"][-1])
             for q in questions for m in q.moves if m.action == "text_search"]
    hits = text_hits(bm25, [m.query for _, m, _ in moves], TEXT_K)
    top1 = top5 = finals = answer5 = 0
    failed: set[str] = set()
    for (q, m, final), found in zip(moves, hits, strict=True):
        urls = [h.url for h in found]
        top1 += bool(urls) and urls[0] == m.expect_url
        top5 += m.expect_url in urls
        finals += final
        answer5 += final and any(q.answer in h.text for h in found)  # the hop that yields the answer
        if m.expect_url not in urls:
            failed.add(q.id)
    n = max(1, len(moves))
    stats = {"text_searches": len(moves), "gold_doc_top1": round(top1 / n, 4),
             "gold_doc_top5": round(top5 / n, 4), "answer_doc_top5": round(answer5 / max(1, finals), 4),
             "dropped_questions": len(failed)}
    return [q for q in questions if q.id not in failed], stats


def _write_index(root: Path, world: Sequence[Entity], rendered: Sequence[Rendered]) -> str:
    images = [{"id": e.id, "file": f"{e.id}.png", "title": e.title, "description": e.description,
               "url": e.url, "phash": r.phash, "dhash": r.dhash}
              for e, r in zip(world, rendered, strict=True)]
    data = json.dumps({"hash_kind": HASH_KIND, "images": images}, indent=1, ensure_ascii=False)
    return write_atomic(root / "images" / "index.json", data.encode())


def _calibrate_views(runner: _Runner, root: Path, seed: int, world: Sequence[Entity],
                     views: dict[str, RenderedView], entity_of: dict[str, str], image_rank: int,
                     progress: bool) -> dict[str, Any]:
    """Redraw every view the real index does not list within ``image_rank`` until it does."""
    index = LocalImageIndex(root / "images")
    pos = {e.id: i for i, e in enumerate(world)}
    looks = {e.id: e.look for e in world}

    def check(name: str) -> ImageCheck:
        v = views[name]
        return check_view(index, pos[entity_of[name]], v.phash, v.dhash)

    def passes(c: ImageCheck) -> bool:
        return c.listed and c.rank < image_rank

    first = {name: check(name) for name in views}
    n = max(1, len(first))
    stats: dict[str, Any] = {
        "views": len(first), "required_rank": image_rank,
        "first_draw_top1": round(sum(c.listed and c.rank < 1 for c in first.values()) / n, 4),
        "first_draw_top3": round(sum(c.listed and c.rank < 3 for c in first.values()) / n, 4)}
    pending = sorted(name for name, c in first.items() if not passes(c))
    stats["redrawn_views"] = len(pending)
    with tqdm(desc="redraw views", unit="entity", disable=not progress or not pending) as bar:
        while pending:
            by_entity: dict[str, list[tuple[str, int]]] = defaultdict(list)
            for name in pending:
                if views[name].attempt + 1 >= MAX_VIEW_ATTEMPTS:
                    raise WorldError(f"image search never finds the entity of view {name}")
                by_entity[entity_of[name]].append((name, views[name].attempt + 1))
            jobs = [RenderJob(str(root), seed, eid, looks[eid], False, tuple(v))
                    for eid, v in by_entity.items()]
            for r in runner.start(jobs, bar)():
                for v in r.views:
                    views[v.name] = v
            pending = [name for name in pending if not passes(check(name))]
    stats["max_attempt"] = max((v.attempt for v in views.values()), default=0)
    return stats


def _assign_views(questions: Sequence[Question]) -> dict[str, str]:
    """Question images: an invented entity has one view for its search, named and two-hop questions and
    one for its visual and detail questions; every knowledge question has its own. Returns view -> entity."""
    entity_of: dict[str, str] = {}
    knowledge_seen: dict[str, int] = defaultdict(int)
    for q in questions:
        if q.kind == "knowledge":
            name = f"{q.entity_id}.{knowledge_seen[q.entity_id]}"
            knowledge_seen[q.entity_id] += 1
        else:
            name = f"{q.entity_id}.{1 if q.kind in ('visual', 'detail') else 0}"
        q.image = f"views/{name}.jpg"
        entity_of[name] = q.entity_id
    return entity_of


def _remove_stale(root: Path, keep: set[str]) -> None:
    """Files a previous build (or a dropped question) left behind: only names this builder writes."""
    for sub, pattern in (("views", "*.jpg"), ("images", "*.png")):
        for path in (root / sub).glob(pattern):
            if f"{sub}/{path.name}" not in keep:
                path.unlink()


def build_world(root: str | os.PathLike[str], entities: int, seed: int, *, processes: int = 1,
                progress: bool = False, image_rank: int = 1) -> BuildReport:
    """Build a world of ``entities`` invented entities (plus the fixed knowledge ones) into ``root``."""
    if entities < 1 or not 1 <= image_rank <= 3 or processes < 1:
        raise InvalidRequest("need entities >= 1, processes >= 1 and image_rank 1, 2 or 3")
    start = time.perf_counter()
    out = Path(root)
    for sub in ("images", "views"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    names = fixed_names()
    knowledge = knowledge_entities()
    world = knowledge + generate_entities(entities, seed, names, knowledge_words())
    docs = build_corpus(world, names.people, seed)
    # Near-namesakes share a split: a training search for one would otherwise show the other's facts.
    stem_split = assign_splits(sorted({e.stem for e in world[len(knowledge):]}), seed)
    split_of = {e.id: stem_split[e.stem] for e in world[len(knowledge):]}
    planned = plan_questions(world[len(knowledge):], knowledge, split_of, {d["url"]: d["text"] for d in docs},
                             names.people, seed)
    entity_of = _assign_views(planned)
    by_entity: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for name, eid in entity_of.items():
        by_entity[eid].append((name, 0))
    jobs = [RenderJob(str(out), seed, e.id, e.look, True, tuple(by_entity[e.id])) for e in world]
    with _Runner(processes) as runner:
        with tqdm(total=len(jobs), desc="draw pictures", unit="entity", disable=not progress) as bar:
            wait = runner.start(jobs, bar)
            questions, text_stats = _calibrate_text(planned, docs)  # while the workers draw
            rendered = wait()
        digests = {f"images/{r.entity_id}.png": r.sha256 for r in rendered}
        digests["images/index.json"] = _write_index(out, world, rendered)
        used = {q.image.removeprefix("views/").removesuffix(".jpg") for q in questions}
        views = {v.name: v for r in rendered for v in r.views if v.name in used}
        image_stats = _calibrate_views(runner, out, seed, world, views, entity_of, image_rank, progress)
    plaque = {r.entity_id: r.plaque_box for r in rendered}
    for q in questions:
        name = q.image.removeprefix("views/").removesuffix(".jpg")
        if q.kind == "detail":
            q.moves[0].box = list(zoom_box(views[name].crop, plaque[q.entity_id]))
        validate(q)
        digests[q.image] = views[name].sha256
    corpus = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
    digests["corpus.jsonl"] = write_atomic(out / "corpus.jsonl", corpus.encode())
    lines = "".join(json.dumps(q.to_json(), ensure_ascii=False) + "\n" for q in questions)
    digests["questions.jsonl"] = write_atomic(out / "questions.jsonl", lines.encode())
    _remove_stale(out, set(digests))
    manifest = {"world_version": WORLD_VERSION, "seed": seed, "entities": entities,
                "knowledge_entities": len(knowledge), "people": len(names.people), "documents": len(docs),
                "images": len(world), "views": len(views), "questions": count_questions(questions),
                "calibration": {"image_search": image_stats, "text_search": text_stats},
                "fingerprint": fingerprint(digests)}
    write_atomic(out / "manifest.json", (json.dumps(manifest, indent=1) + "\n").encode())
    return BuildReport(out, manifest, time.perf_counter() - start)


def world_entities(root: str | os.PathLike[str]) -> list[Entity]:
    """A built world's entities (knowledge ones first), regenerated from its manifest's seed and size:
    the looks are not stored, and generation is deterministic (half a second for 5,000)."""
    manifest = json.loads((Path(root) / "manifest.json").read_text(encoding="utf-8"))
    if manifest.get("world_version") != WORLD_VERSION:
        raise WorldError(f"{root} was built by world version {manifest.get('world_version')}, "
                         f"this code makes version {WORLD_VERSION}: rebuild it")
    knowledge = knowledge_entities()
    return knowledge + generate_entities(int(manifest["entities"]), int(manifest["seed"]), fixed_names(),
                                         knowledge_words())

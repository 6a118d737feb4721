"""``ssr-lab train pretrain``: language-model pretraining of a fresh model on the world's own text.

A real SSR model starts from a pretrained Qwen3-VL, which already copies: a name read in the question or
in a search result comes back in the query or the answer. A fresh tiny model cannot, and SFT alone does
not teach it: its loss is on the assistant's tokens only, a few copied tokens per trajectory, and after
1,000 steps the query ignored the question (3% test success). Next-token prediction on every token of
the corpus, entity by entity (each entity's documents together, so that its name recurs), gives the
copying circuit a dense signal: this stage stands in for the base model's pretraining. Only the
training split's entities (and the well-known ones) are read, so test entities stay unseen.
"""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ssr_lab.train.checkpoint import reproduce, write_card
from ssr_lab.train.config.pretrain import PretrainConfig as PretrainConfig  # re-exported: its old home
from ssr_lab.train.schedule import cosine_lr
from ssr_lab.train.setup import new_model, split_questions
from ssr_lab.world.names import make_word
from ssr_lab.world.records import Question, load_questions
from ssr_server.core.formats.format import get_format
from ssr_server.core.library import LibraryRegistry
from ssr_server.core.progress import progress_bar
from ssr_server.engine.tiny import save_model


@dataclass(frozen=True)
class EntityText:
    """One entity's documents (as a search result shows them) and its named questions with answers."""

    stem: str  # the invented word that names it ("Zemclinard" of "Zemclinard soup"); "" keeps the name
    docs: tuple[str, ...]
    qa: tuple[str, ...]


def entity_texts(world: Path, questions: Sequence[Question]) -> dict[str, EntityText]:
    """The corpus documents and named questions of the questions' entities, grouped by entity."""
    wanted = {q.entity_id for q in questions}
    docs: dict[str, list[str]] = defaultdict(list)
    titles: dict[str, str] = {}
    with (world / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            entity = doc["id"].split("#", 1)[0]
            if entity in wanted:
                docs[entity].append(f"{doc['title']}\n{doc.get('url', '')}\n{doc['text']}")
                titles[entity] = doc["title"]
    qa: dict[str, list[str]] = defaultdict(list)
    for q in questions:
        if q.kind == "named" and q.entity_id in docs:
            qa[q.entity_id].append(f"{q.question} {q.answer}")
    # The well-known entities keep their names: their facts are to be remembered, not looked up.
    return {e: EntityText("" if e.startswith("k-") else titles[e].split()[0], tuple(d), tuple(qa[e]))
            for e, d in docs.items()}


def renamed(text: str, stem: str, new: str) -> str:
    return text.replace(stem, new).replace(stem.lower(), new.lower()) if stem else text


def token_stream(texts: dict[str, EntityText], tok: Any, rng: random.Random, *, rename: bool = True,
                 questions: bool = True) -> Iterator[int]:
    """Endless token ids: a random entity's documents in random order, then (``questions``) its named
    questions with their answers, under (``rename``) a fresh invented name each time, so that a name is
    predictable only by copying it from earlier in the row, never by remembering it; then another
    entity's. With both off it is the corpus as it is (the base of the shipped model was trained so)."""
    entities = sorted(texts)
    if not entities:
        raise ValueError("no corpus documents for the training entities")
    while True:
        item = texts[rng.choice(entities)]
        group = list(item.docs)
        rng.shuffle(group)
        text = "\n\n".join(group) + "\n\n"
        if questions:
            text += "".join(line + "\n" for line in item.qa) + "\n"
        if rename:
            text = renamed(text, item.stem, make_word(rng, rng.choice((2, 2, 3))))
        yield from tok.encode(text, add_special_tokens=False)


def train_pretrain(cfg: PretrainConfig, progress: bool = True) -> dict[str, Any]:
    """Train a fresh model on the corpus text, save ``cfg.out`` (model + card + log), return figures."""
    started = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    fmt = get_format()
    library = LibraryRegistry().get(cfg.library)
    # The same questions as `train sft` reads, so that the learned tokenizer is the same and SFT from
    # this model finds its replayed examples in the world's cache.
    questions = split_questions(load_questions(cfg.world / "questions.jsonl"), "train", None, cfg.seed)
    model, tok = new_model(cfg.init, cfg.world, questions, fmt, library, cfg.seed)
    texts = entity_texts(cfg.world, questions)
    rng = random.Random(cfg.seed)
    stream = token_stream(texts, tok, rng, rename=cfg.rename, questions=cfg.questions)
    text_model, head = model.model.language_model, model.lm_head
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98),
                                  weight_decay=cfg.weight_decay)
    cfg.out.mkdir(parents=True, exist_ok=True)
    model.train()
    bar = progress_bar(total=cfg.steps, desc="pretrain", unit="step", disable=not progress)
    ema: float | None = None
    first_loss: float | None = None
    step, stopped_early = 0, False
    with (cfg.out / "train_log.jsonl").open("w", encoding="utf-8") as log:
        while step < cfg.steps:
            rows = [[next(stream) for _ in range(cfg.seq_len)] for _ in range(cfg.batch_size)]
            ids = torch.tensor(rows, device=model.device)  # (B, T)
            for group in optimizer.param_groups:
                group["lr"] = cosine_lr(step, cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr_ratio)
            hidden = text_model(input_ids=ids).last_hidden_state  # (B, T, H)
            logits = head(hidden[:, :-1])  # (B, T-1, V)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     ids[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            optimizer.step()
            step += 1
            value = float(loss.detach())
            first_loss = value if first_loss is None else first_loss
            ema = value if ema is None else 0.95 * ema + 0.05 * value
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}", refresh=False)
            if step % cfg.log_every == 0:
                log.write(json.dumps({"step": step, "loss": value, "loss_ema": ema}) + "\n")
                log.flush()
            if (time.perf_counter() - started) / 60 > cfg.max_minutes:
                stopped_early = True
                break
    bar.close()
    config = {k: str(v) for k, v in asdict(cfg).items()}
    commands = reproduce(cfg.world, cfg.init)
    figures = {
        "steps": step, "planned_steps": cfg.steps, "stopped_at_time_budget": stopped_early,
        "entities": len(texts), "documents": sum(len(t.docs) for t in texts.values()),
        "tokens_seen": step * cfg.batch_size * cfg.seq_len, "first_loss": first_loss, "final_loss_ema": ema,
        "minutes": (time.perf_counter() - started) / 60,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    model.eval()
    save_model(model, tok, cfg.out, {"trained": "pretrain", **config, "commands": commands})
    write_card(cfg.out, {
        "title": f"ssr-server pretrained base ({cfg.init})", "command": "\n".join(commands),
        "description": f"A fresh Qwen3-VL-architecture model after next-token pretraining on the corpus of "
                       f"the training entities of {cfg.world}: the base `ssr-lab train sft` starts from.",
        **figures, **{f"config.{k}": v for k, v in config.items()}})
    return figures

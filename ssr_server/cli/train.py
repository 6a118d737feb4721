"""``ssr-server train``: pretraining, SFT, the vision tower, reading probes and SSR-GRPO."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

train_app = typer.Typer(no_args_is_help=True, help="Train a selector: SFT and SSR-GRPO on a world.")


def _kind_repeats(items: list[str]) -> tuple[tuple[str, int], ...]:
    from ssr_server.world.records import KINDS

    out: list[tuple[str, int]] = []
    for item in items:
        kind, _, n = item.partition("=")
        if kind not in KINDS or not n.isdigit() or int(n) < 1:
            raise typer.BadParameter(f"--repeat takes KIND=N, KIND one of {', '.join(KINDS)} and N >= 1, "
                                     f"got {item!r}")
        out.append((kind, int(n)))
    return tuple(out)


def _int_pair(text: str, option: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"{option} takes two integers such as 2,4") from None
    if a < 0 or b < 0:
        raise typer.BadParameter(f"{option} takes non-negative integers")
    return a, b


def _sign_attributes(text: str) -> tuple[str, ...]:
    from ssr_server.train.look_zoom import SIGN_ATTRIBUTES

    chosen = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in chosen if a not in SIGN_ATTRIBUTES]
    if not chosen or unknown:
        raise typer.BadParameter(f"--zoom-sign-on takes {' and/or '.join(SIGN_ATTRIBUTES)}, not {text!r}")
    return chosen


def _jitter_help(what: str) -> str:
    return (f"{what} move sideways by a random amount up to this many gold-box widths (0: centred), "
            "as a model's imprecise zoom box makes them")


def zoom_style(text: str) -> str:
    from ssr_server.world.views import check_zoom_style

    try:
        return check_zoom_style(text)
    except ValueError as exc:
        raise typer.BadParameter(f"--zoom: {exc}") from None


def _report_training(figures: dict[str, Any], out: Path) -> None:
    typer.echo(json.dumps(figures, indent=1, default=str))
    typer.echo(f"model written to {out}")


@train_app.command("sft")
def train_sft_command(
    world: Annotated[Path, typer.Option(help="a `world build` folder")],
    out: Annotated[Path, typer.Option(help="where the model goes (resumes from its checkpoints)")],
    format: Annotated[str, typer.Option(help="ssr | freeform: the trajectories' form")] = "ssr",
    init: Annotated[str, typer.Option(help="a shape HxL (fresh model) or a model folder")] = "256x4",
    library: Annotated[str, typer.Option(help="the rationale library (ssr form)")] = "default",
    label_only: Annotated[bool, typer.Option(help="train on index labels instead of texts")] = False,
    steps: Annotated[int, typer.Option(min=1)] = 1500,
    batch_size: Annotated[int, typer.Option(min=1)] = 16,
    lr: Annotated[float, typer.Option()] = 1e-3,
    seed: Annotated[int, typer.Option()] = 0,
    limit: Annotated[int | None, typer.Option(help="at most this many training questions")] = None,
    paraphrases: Annotated[int, typer.Option(min=1, help="freeform: reasoning paraphrases each")] = 2,
    max_minutes: Annotated[float, typer.Option(help="wall-clock budget; saves and stops")] = 28.0,
    anneal_by_time: Annotated[bool, typer.Option(help="the learning rate also decays with the share of "
                                                      "--max-minutes spent, so that a run the budget "
                                                      "cuts short still ends annealed (not "
                                                      "deterministic)")] = False,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: all cores)")] = None,
    rename: Annotated[bool, typer.Option(help="a fresh name for the entity at each draw (copy, not "
                                                "remember)")] = False,
    drills: Annotated[bool, typer.Option(help="interleave short copying drills (query, answer)")] = False,
    drill_sizes: Annotated[str, typer.Option(help="answer,query drill batches in multiples of "
                                                  "--batch-size")] = "2,4",
    drill_calls: Annotated[str, typer.Option(help="query drills of each trajectory's first text search, "
                                                  "or of all (two-hop: the second hop too)")] = "first",
    drills_repeat: Annotated[bool, typer.Option(help="drills drawn with the --repeat weights too")] = False,
    rephrase: Annotated[float, typer.Option(min=0.0, max=1.0, help="share of drawn fact and two-hop "
                                                                   "questions asked in other words")] = 0.0,
    rephrase_pictures: Annotated[bool, typer.Option(help="--rephrase also the visual and detail questions "
                                                         "(frames the sign and the plaque share), in "
                                                         "trajectories and picture drills")] = False,
    rephrase_refs: Annotated[bool, typer.Option(help="--rephrase draws picture references from a longer "
                                                     "list (\"the gate in the photo\", \"... in the shot\")")
                             ] = False,
    rephrase_openings: Annotated[bool, typer.Option(help="--rephrase-pictures also draws stems that open on "
                                                         "a place (\"On the tiny badge, what character is "
                                                         "printed?\")")] = False,
    drill_contrast: Annotated[bool, typer.Option(help="each two-hop second query drill also asked about the "
                                                      "other person attribute (born / birthplace)")] = False,
    copy_every: Annotated[int, typer.Option(min=0, help="every Nth step a batch of the synthetic copying "
                                                        "task (0: never)")] = 0,
    copy_warmup: Annotated[int, typer.Option(min=0, help="steps of the copying task alone first")] = 0,
    repeat: Annotated[list[str] | None, typer.Option(help="KIND=N: that question kind's trajectories N times "
                                                          "per epoch (repeatable)")] = None,
    pictures_every: Annotated[int, typer.Option(min=0, help="every Nth step a batch of picture drills: "
                                                            "visual/detail trajectories with a freshly "
                                                            "drawn picture (0: never; 1: every step, "
                                                            "a reading phase)")] = 0,
    pictures_batch: Annotated[int, typer.Option(min=1, help="drills per picture batch")] = 32,
    picture_moves: Annotated[bool, typer.Option(help="picture drills also of first moves (search, two-hop, "
                                                     "knowledge), not only of reading")] = True,
    freeze_vision: Annotated[bool, typer.Option(help="keep the vision tower as loaded (e.g. what `train "
                                                     "vision` taught it); train the language model "
                                                     "only")] = False,
    zoom: Annotated[str, typer.Option(help="the zoom box of detail trajectories and drills: tight (the gold "
                                           "box), strip (its rows, the whole width), wide (3x its "
                                           "width) or coarse (two calls: the strip, then the wide "
                                           "columns in the strip's crop)")] = "tight",
    zoom_jitter: Annotated[float, typer.Option(min=0.0, max=3.0,
                                               help=_jitter_help("picture drills' crops"))] = 0.0,
    zoom_edge_jitter: Annotated[float, typer.Option(min=0.0, max=0.5, help=(
        "then each edge of a picture drill's crop moves by up to this share of the gold box's size: other "
        "rows and scales, as a model's own boxes have"))] = 0.0,
    zoom_retry: Annotated[float, typer.Option(min=0.0, max=1.0, help=(
        "share of the plaque's picture drills whose first zoom misses the plaque (moved sideways) and whose "
        "second zoom finds it: a model that misses learns to look again"))] = 0.0,
    zoom_sign: Annotated[bool, typer.Option(help="questions about the big sign zoom on it before they answer "
                                                 "(the tiny tower cannot read it at the question image's "
                                                 "35 tokens); the world is not changed")] = False,
    zoom_sign_on: Annotated[str, typer.Option(help="with --zoom-sign, the sign questions that zoom, by what "
                                                   "they ask: shape, char or both (comma-separated)")]
        = "shape,char",
    zoom_count: Annotated[bool, typer.Option(help="count questions zoom on the motif before they answer")]
        = False,
    search_count: Annotated[bool, typer.Option(help=(
        "count questions take a search question's moves: image search, text search for the entity's "
        "description (it holds the count; no tiny tower here counts), answer; the world is not "
        "changed"))] = False,
    grow_layers: Annotated[int, typer.Option(min=0, max=16, help=(
        "append N decoder layers to the language model before training, each starting as the identity "
        "(output projections at zero): room to learn more without losing what --init knows"))] = 0,
    vision_lr_scale: Annotated[float, typer.Option(min=0.01, max=1.0, help=(
        "train the vision tower with the language model at this share of the learning rate (1: alike); "
        "not with --freeze-vision"))] = 1.0,
) -> None:
    """Supervised training on the world's oracle trajectories (loss on assistant tokens only)."""
    from ssr_server.train.sft import SFTConfig, train_sft

    if format not in ("ssr", "freeform"):
        raise typer.BadParameter("format must be ssr or freeform")
    if copy_every == 1:
        raise typer.BadParameter("--copy-every takes 0 (never) or N >= 2 (every Nth step)")
    if (rephrase_pictures or rephrase_refs) and not rephrase:
        raise typer.BadParameter("--rephrase-pictures and --rephrase-refs need a --rephrase share above 0")
    if rephrase_openings and not rephrase_pictures:
        raise typer.BadParameter("--rephrase-openings rephrases picture questions: "
                                 "it needs --rephrase-pictures")
    if zoom_count and search_count:
        raise typer.BadParameter("--zoom-count and --search-count are two routes for the same questions: "
                                 "take one")
    if drill_calls not in ("first", "all"):
        raise typer.BadParameter("--drill-calls takes first or all")
    if freeze_vision and vision_lr_scale != 1.0:
        raise typer.BadParameter("--vision-lr-scale sets the rate of a tower that --freeze-vision keeps "
                                 "still: take one")
    figures = train_sft(SFTConfig(world=world, out=out, format=format, init=init, library=library,
                                  label_only=label_only, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                                  limit=limit, paraphrases=paraphrases, max_minutes=max_minutes,
                                  anneal_by_time=anneal_by_time, threads=threads, rename=rename,
                                  drills=drills,
                                  drill_sizes=_int_pair(drill_sizes, "--drill-sizes"),
                                  drill_calls=drill_calls, drills_repeat=drills_repeat,
                                  drill_contrast=drill_contrast, rephrase=rephrase,
                                  rephrase_pictures=rephrase_pictures, rephrase_refs=rephrase_refs,
                                  rephrase_openings=rephrase_openings,
                                  copy_every=copy_every,
                                  copy_warmup=copy_warmup, repeat=_kind_repeats(repeat or []),
                                  pictures_every=pictures_every, pictures_batch=pictures_batch,
                                  picture_moves=picture_moves, freeze_vision=freeze_vision,
                                  zoom=zoom_style(zoom), zoom_jitter=zoom_jitter,
                                  zoom_edge_jitter=zoom_edge_jitter, zoom_retry=zoom_retry,
                                  zoom_sign=zoom_sign, zoom_sign_on=_sign_attributes(zoom_sign_on),
                                  zoom_count=zoom_count, search_count=search_count,
                                  grow_layers=grow_layers, vision_lr_scale=vision_lr_scale))
    _report_training(figures, out)


@train_app.command("vision")
def train_vision_command(
    init: Annotated[Path, typer.Option(help="the model folder whose vision tower is trained")],
    out: Annotated[Path, typer.Option(help="where the model goes")],
    steps: Annotated[int, typer.Option(min=1)] = 1000,
    batch_size: Annotated[int, typer.Option(min=1, help="pictures per step")] = 32,
    lr: Annotated[float, typer.Option()] = 1e-3,
    reinit: Annotated[bool, typer.Option(help="start the tower from fresh weights")] = False,
    grow: Annotated[int, typer.Option(min=0, max=8, help=(
        "append this many blocks to the tower, each starting as the identity (the language model reads "
        "the same tokens until training moves them)"))] = 0,
    seed: Annotated[int, typer.Option()] = 0,
    max_minutes: Annotated[float, typer.Option(help="wall-clock budget; saves and stops")] = 28.0,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: all cores)")] = None,
    heads: Annotated[str, typer.Option(help="comma-separated heads: colour, count, sign, plaque, count_mean "
                                            "(count from the tokens' mean), known (well-known entities), "
                                            "plaque_x, plaque_y (where the plaque is, in tenths), "
                                            "sign_crop, count_crop (the big sign, the count read from "
                                            "a zoom crop around the sign, the motif)")]
        = "colour,count,sign,plaque",
    known_share: Annotated[float, typer.Option(min=0.0, max=1.0, help="with the known head: share of "
                                                                      "pictures of well-known entities")]
        = 0.25,
    anchor: Annotated[float, typer.Option(min=0.0, help="weight of the tokens' drift from the initial "
                                                        "tower's (0: free)")] = 0.0,
    anchor_crops: Annotated[float | None, typer.Option(
        min=0.0, help="the same for the zoom crops' tokens (default: as --anchor; 0 frees a crop style the "
                      "language model has not read yet while the question pictures stay anchored)")] = None,
    image_pixels: Annotated[int | None, typer.Option(
        min=4096, help="resize every picture to about this many pixels, and the model keeps it (default: as "
                       "--init does); 143360 = 448x320, four times the tokens of the world's pictures")
    ] = None,
    max_pixels: Annotated[int | None, typer.Option(
        min=4096, help="only the most pixels a picture keeps, and the model keeps it: the question images "
                       "(35,840 px) stay as they are, a wider zoom crop (a strip: 1024x123) gets more tokens")
    ] = None,
    zoom: Annotated[str, typer.Option(help="the plaque head reads the crop at the zoom box of this style: "
                                           "tight (the gold box), strip (its rows, the whole width), "
                                           "wide (3x its width; coarse reads the same crop)")]
        = "tight",
    zoom_jitter: Annotated[float, typer.Option(min=0.0, max=3.0, help=_jitter_help("the crops"))] = 0.0,
    zoom_edge_jitter: Annotated[float, typer.Option(min=0.0, max=0.5, help=(
        "then each crop edge moves by up to this share of the gold box's size"))] = 0.0,
) -> None:
    """Train the vision tower on freshly drawn pictures (heads on what questions read, not kept)."""
    from ssr_server.train.vision import EXTRA, LABELS, VisionConfig, train_vision

    if not (init / "config.json").is_file():
        raise typer.BadParameter(f"{init} is not a model folder (no config.json)")
    chosen = tuple(h.strip() for h in heads.split(",") if h.strip())
    if not chosen or set(chosen) - set(LABELS) - set(EXTRA):
        raise typer.BadParameter(f"--heads takes some of {', '.join([*LABELS, *EXTRA])}")
    figures = train_vision(VisionConfig(init=init, out=out, steps=steps, batch_size=batch_size, lr=lr,
                                        reinit=reinit, grow=grow, seed=seed, max_minutes=max_minutes,
                                        threads=threads,
                                        heads=chosen, known_share=known_share, anchor=anchor,
                                        anchor_crops=anchor_crops,
                                        image_pixels=image_pixels, max_pixels=max_pixels,
                                        zoom=zoom_style(zoom), zoom_jitter=zoom_jitter,
                                        zoom_edge_jitter=zoom_edge_jitter))
    _report_training(figures, out)


@train_app.command("soup")
def train_soup_command(
    models: Annotated[list[Path], typer.Argument(help="model folders tuned from one start (two or more)")],
    out: Annotated[Path, typer.Option(help="where the averaged model goes")],
    weights: Annotated[str | None, typer.Option(help="comma-separated mixing weights, one per model "
                                                     "(normalised; default: uniform)")] = None,
) -> None:
    """Average the weights of models fine-tuned from one start (a model soup)."""
    from ssr_server.train.soup import SoupError, soup

    try:
        mix = [float(w) for w in weights.split(",")] if weights else None
    except ValueError:
        raise typer.BadParameter("--weights takes numbers such as 0.5,0.5") from None
    try:
        figures = soup(models, out, mix)
    except SoupError as exc:
        raise typer.BadParameter(str(exc)) from None
    _report_training(figures, out)


@train_app.command("pretrain")
def train_pretrain_command(
    world: Annotated[Path, typer.Option(help="a `world build` folder")],
    out: Annotated[Path, typer.Option(help="where the model goes")],
    init: Annotated[str, typer.Option(help="the shape HxL[-tied] of the fresh model")] = "128x4-tied",
    steps: Annotated[int, typer.Option(min=1)] = 1000,
    batch_size: Annotated[int, typer.Option(min=1)] = 16,
    seq_len: Annotated[int, typer.Option(min=8, help="tokens per row")] = 384,
    lr: Annotated[float, typer.Option()] = 3e-3,
    seed: Annotated[int, typer.Option()] = 0,
    max_minutes: Annotated[float, typer.Option(help="wall-clock budget; saves and stops")] = 10.0,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: all cores)")] = None,
    rename: Annotated[bool, typer.Option(help="a fresh invented name per entity group")] = True,
    questions: Annotated[bool, typer.Option(help="named questions + answers after each group")] = True,
) -> None:
    """Next-token pretraining of a fresh model on the training entities' corpus (the base for SFT)."""
    from ssr_server.train.pretrain import PretrainConfig, train_pretrain

    figures = train_pretrain(PretrainConfig(
        world=world, out=out, init=init, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr,
        seed=seed, max_minutes=max_minutes, threads=threads, rename=rename, questions=questions))
    _report_training(figures, out)


@train_app.command("grpo")
def train_grpo_command(
    world: Annotated[Path, typer.Option(help="a `world build` folder")],
    init: Annotated[Path, typer.Option(help="the SFT model to start from")],
    out: Annotated[Path, typer.Option(help="where the model goes (resumes from its checkpoints)")],
    format: Annotated[str, typer.Option(help="ssr | freeform")] = "ssr",
    iterations: Annotated[int, typer.Option(min=1)] = 20,
    questions: Annotated[int, typer.Option(min=1, help="questions per iteration")] = 8,
    group: Annotated[int, typer.Option(min=2, help="rollouts per question (G)")] = 8,
    epochs: Annotated[int, typer.Option(min=1, help="update epochs per rollout batch")] = 2,
    lr: Annotated[float, typer.Option()] = 1e-4,
    clip: Annotated[float, typer.Option(help="PPO clip epsilon")] = 0.2,
    gamma: Annotated[float, typer.Option(help="weight of a selection decision vs an action token")] = 1.0,
    selector_grad: Annotated[str, typer.Option(help="exact (all K scores) | detached (paper)")] = "exact",
    ratio_level: Annotated[str, typer.Option(help="token (GRPO) | sequence (GSPO) for actions")] = "token",
    kl: Annotated[float, typer.Option(help="KL to the initial model on action tokens")] = 0.0,
    tau: Annotated[float, typer.Option(min=0.0, help="selection temperature of the rollouts (and of q "
                                                     "in the ratio)")] = 1.0,
    temperature: Annotated[float, typer.Option(min=0.0, help="action sampling temperature of the "
                                                             "rollouts")] = 1.0,
    seed: Annotated[int, typer.Option()] = 0,
    max_minutes: Annotated[float, typer.Option(help="wall-clock budget; saves and stops")] = 28.0,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: all cores)")] = None,
    kind: Annotated[list[str] | None, typer.Option(help="draw only questions of this kind (repeatable; "
                                                        "default: every kind)")] = None,
    freeze_vision: Annotated[bool, typer.Option(help="keep the vision tower as loaded")] = False,
    anchor: Annotated[float, typer.Option(min=0.0, help="weight of an SFT anchor: the oracle "
                                                        "trajectories' cross-entropy (every kind) added "
                                                        "at each step")] = 0.0,
    anchor_batch: Annotated[int, typer.Option(min=1, help="anchor trajectories per step")] = 16,
    anchor_zoom: Annotated[str, typer.Option(help="zoom style of the anchor's trajectories (the one the "
                                                  "model was trained on)")] = "tight",
    anchor_rename: Annotated[bool, typer.Option(help="rename the anchor's entities (as `train sft "
                                                     "--rename`)")] = False,
    anchor_rephrase: Annotated[float, typer.Option(min=0.0, max=1.0, help="share of the anchor's "
                                                   "questions rephrased (as `train sft --rephrase`)")] = 0.0,
) -> None:
    """GRPO through the real agent loop; SSR turns contribute one categorical ratio each."""
    from ssr_server.train.grpo import GRPOConfig, train_grpo
    from ssr_server.world.records import KINDS
    from ssr_server.world.views import ZOOM_STYLES

    unknown = sorted(set(kind or []) - set(KINDS))
    if unknown:
        raise typer.BadParameter(f"--kind: {', '.join(unknown)} (kinds: {', '.join(KINDS)})")
    if anchor_zoom not in ZOOM_STYLES:
        raise typer.BadParameter(f"--anchor-zoom: one of {', '.join(ZOOM_STYLES)}")

    if format not in ("ssr", "freeform") or selector_grad not in ("exact", "detached") \
            or ratio_level not in ("token", "sequence"):
        raise typer.BadParameter("format: ssr|freeform; selector-grad: exact|detached; "
                                 "ratio-level: token|sequence")
    if format == "ssr" and tau <= 0:
        raise typer.BadParameter("--tau must be > 0: the ssr ratio is over q = softmax(S / tau)")
    figures = train_grpo(GRPOConfig(
        world=world, init=init, out=out, format=format, iterations=iterations, questions=questions,
        group=group,
        epochs=epochs, lr=lr, clip=clip, gamma=gamma, selector_grad=selector_grad,  # type: ignore[arg-type]
        ratio_level=ratio_level, kl=kl, seed=seed, max_minutes=max_minutes,  # type: ignore[arg-type]
        threads=threads, tau=tau, temperature=temperature, kinds=tuple(kind or ()),
        freeze_vision=freeze_vision, anchor=anchor, anchor_batch=anchor_batch, anchor_zoom=anchor_zoom,
        anchor_rename=anchor_rename, anchor_rephrase=anchor_rephrase))
    _report_training(figures, out)

"""Natural reasoning for freeform oracle trajectories: varied prose per move, with the question's words.

A freeform agent decodes a paragraph before each action; its training data needs that paragraph to say
what the move is for, in varied words (ten templates per move, 20-80 tokens), using the entity and
fact words the agent could know at that point: before the image search it does not know the entity's
name (it says "this landmark"), after it does.
"""

from __future__ import annotations

import random

from ssr_lab.world.records import (
    FROM_EVIDENCE,
    FROM_IMAGE,
    FROM_KNOWLEDGE,
    IDENTIFY,
    LOOKUP,
    ZOOM,
    Question,
)

_TEMPLATES: dict[str, tuple[str, ...]] = {
    IDENTIFY: (
        'The question asks about the {what} in the picture, but nothing in the image tells me its name. A'
        ' reverse image search should find pages showing the same {what}, and their titles will name it.',
        'I do not recognise this {what}. Before I can look up its {attr}, I need to know exactly what it '
        'is, so I will search the web with the image itself.',
        'To answer I first have to identify the {what}. Its appearance alone is not enough for me, so a '
        'search with the picture is the fastest way to get its name.',
        'This {what} is unfamiliar to me and the question depends on knowing which one it is. Searching '
        'with the image should return similar pictures with titles.',
        'I cannot tell which {what} this is from the picture alone. An image search will show matching '
        'pictures and their names, which I can then use for a text search.',
        'The {attr} of this {what} is not visible, and I do not even know its name yet. Let me identify '
        'it with a reverse image search first.',
        'Nothing painted in the image gives the name of this {what}. I should search with the image so '
        'that the results tell me what it is called.',
        'My first step is to find out what this {what} is. A reverse image search is the right tool, '
        'because it matches the picture against images on the web.',
        'The question needs a fact about a specific {what}, and I cannot name it from sight. I will run '
        'an image search to identify it before anything else.',
        'Identifying the {what} comes first: with its name I can search for the {attr}. The picture is '
        'all I have, so I search with it.',
    ),
    LOOKUP: (
        'I know this is {name}, but I do not know its {attr}. A text search for {name} and {attr} should '
        'return a page that states it.',
        'The {what} is {name}. Its {attr} is not something I can see or remember, so I will search the '
        'web for it by name.',
        'Now that I know the name, {name}, I need the specific fact the question asks for: the {attr}. A '
        'text search with the name should find it.',
        'I have identified {name}. The {attr} is a fact I have to look up, so I will query the search '
        'engine with the name and the attribute.',
        'The remaining gap is the {attr} of {name}. Searching the web for those words should bring up a '
        'page with the answer.',
        '{name} is what the question is about, yet its {attr} is unknown to me. Let me search for it '
        'rather than guess.',
        'I can name the subject, {name}, but the question asks about its {attr}, which I do not know. A '
        'text search is the way to find it.',
        'To answer I need the {attr} of {name}, which I do not know. I will look it up with a text search'
        ' using the name of the {what}.',
        'The question wants the {attr}. I know we are talking about {name}, so a search for that name and'
        ' attribute should settle it.',
        'Knowing it is {name} is not enough; the {attr} has to come from a source. I will search the web '
        'for {name} {attr}.',
    ),
    ZOOM: (
        'The question is about a small detail of the picture, the {attr}, which is too small to read at '
        'this size. Zooming into that part of the image should make it clear.',
        'I can see where the {attr} is, but it is tiny. Let me crop and enlarge that region so I can read'
        ' it.',
        'The detail the question needs is too small to make out. I will zoom into the area around the '
        '{attr} before answering.',
        'At this resolution the {attr} is illegible, just a few blurred pixels. Enlarging that part of '
        'the image is the right next step.',
        'Answering requires reading a small mark in the picture. I will zoom into the region where it is '
        'so that it becomes readable.',
        'The {attr} is in a corner of the image and far too small. A closer look at that region should '
        'show it clearly.',
        'I should not guess the {attr} from a blurry patch of the picture. Zooming in on that area will '
        'let me see it clearly.',
        'The picture holds the answer, but in a small region. Cropping and enlarging it is the way to '
        'read the {attr}.',
        'Let me look closer: the {attr} is too small in the full picture, so I zoom into the part of the '
        'image that shows it.',
        'Only a zoomed view will make the {attr} legible, because it is so small in the full picture. I '
        'will crop the region that contains it.',
    ),
    FROM_EVIDENCE: (
        'The search results say that the {attr} of {name} is {answer}. That is exactly what the question '
        'asks, so I can answer now without another search.',
        'One of the results states the {attr} of {name} outright: {answer}. The evidence I have gathered '
        'is enough, and there is nothing left to look up.',
        'I found it: the page about {name} gives its {attr} as {answer}. I will give that as the final '
        'answer, since the question asks for nothing else.',
        'The retrieved text answers the question directly, because it gives the {attr} of {name}: '
        '{answer}. No further search is needed before answering.',
        'According to the search results, the {attr} of {name} is {answer}. That matches what the '
        'question wants to know, so I am ready to answer.',
        'The evidence I gathered names the {attr} of {name}, and it is {answer}. That settles the '
        'question, so I will answer with it now.',
        'A result about {name} contains the fact I needed, the {attr}, which is {answer}. With that in '
        'hand I can now give the final answer.',
        'The search turned up the {attr} of {name}: {answer}. The question is answered by this evidence, '
        'so another tool call would not help.',
        'I now have the {attr} of {name} from the results, and it is {answer}. The final answer follows '
        'directly from what the search returned.',
        'The information is in the results: {name} has {attr} {answer}. I trust this source for the '
        'question, so I will answer with it.',
    ),
    FROM_IMAGE: (
        'The answer is visible in the image itself: the {attr} is {answer}. I can answer directly from '
        'what I see, without calling any tool.',
        'Looking carefully at the picture, the {attr} is clearly {answer}. Nothing here needs a search, '
        'so no tool is needed for this question.',
        'The image shows it plainly, and the {attr} is {answer}. I will answer from the picture, since '
        'searching would not add anything useful.',
        'I can read the answer straight from the image in front of me. The {attr} is {answer}, so I can '
        'give the final answer right away.',
        'What the question asks is right there in the picture, and it is {answer}. Since the {attr} can '
        'be seen directly, I answer now.',
        'The picture answers this question by itself: the {attr} is {answer}. There is no need to search '
        'the web or zoom in any further.',
        'From what I see in the image, the {attr} is {answer}, so I can give the answer directly instead '
        'of using one of the tools.',
        'The {attr} can be seen in the image without any doubt: it is {answer}. There is no need to '
        'search, so I will answer now.',
        'The visual evidence is clear enough to decide: the {attr} is {answer}. I will answer from the '
        'image rather than call a tool.',
        'Now the detail is easy to see in the image, and the {attr} is {answer}. That is my answer, and '
        'no other step is needed.',
    ),
    FROM_KNOWLEDGE: (
        'I recognise {name} and I know its {attr} from general knowledge: it is {answer}. No search is '
        'needed, so I will answer directly.',
        'This is {name}, which is well known. Its {attr} is {answer}, so I can answer right away without '
        'looking anything up.',
        '{name} is familiar to me, and I remember that its {attr} is {answer}. Searching would only '
        'confirm what I already know, so I answer.',
        'I already know this one: it is {name}, and its {attr} is {answer}. I will answer directly '
        'instead of calling a tool.',
        'The picture shows {name}, and general knowledge tells me that its {attr} is {answer}. That is '
        'enough to give the final answer.',
        'No tools are needed here. {name} is famous, and I know that its {attr} is {answer}, so I can '
        'answer the question now.',
        'I am confident about this one: the {attr} of {name} is {answer}. This is common knowledge, so I '
        'will answer without searching.',
        'Everyone knows {name}. Its {attr} is {answer}, and I am sure of it, so I can answer now without '
        'any further step.',
        'From what I know about {name}, the {attr} is {answer}. I do not need the web for a fact this '
        'well known, so I will give that answer.',
        'I recognise {name} immediately, and I remember that its {attr} is {answer}. This is general '
        'knowledge, so I answer right away.',
    ),
}


_READABLE = {"char": "painted character", "count": "number", "born": "year of birth", "died": "year of death",
             "described": "person who described it"}


def _readable(key: str) -> str:
    return _READABLE.get(key, key.replace("_", " "))


def reasoning(question: Question, turn: int, seed: int = 0) -> str:
    """The freeform reasoning before gold move ``turn`` of ``question`` (deterministic per seed)."""
    move = question.moves[turn]
    rng = random.Random(f"{seed}:{question.id}:{turn}")
    known = turn > 0 or move.move in (LOOKUP, FROM_KNOWLEDGE)  # named and knowledge questions name it
    name = question.entity if known else f"this {question.category}"
    parts = question.attribute.split(">") if question.attribute else ["answer"]
    attr = parts[0] if len(parts) > 1 and turn < 2 else parts[-1]
    if len(parts) > 1 and turn >= 2:  # two-hop: the second look-up and the answer are about the person
        name = _person(question.moves[2].query)
    return rng.choice(_TEMPLATES[move.move]).format(
        what=question.category, attr=_readable(attr), name=name, answer=question.answer)


def _person(query: str) -> str:
    """The person a two-hop question's second query is about (the query is "<name> <keyword>")."""
    return query.rsplit(" ", 1)[0] if " " in query else query


def templates(move: str) -> tuple[str, ...]:
    return _TEMPLATES[move]

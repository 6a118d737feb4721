"""A tool's result written as the model reads it, through the prompt format's observation templates.

External text (titles, URLs, snippets, error reasons) is escaped; new images (a zoomed crop, search
thumbnails) are named by the format's placeholders, numbered after the images already in the run.
"""

from __future__ import annotations

from collections.abc import Callable

from ssr_server.core.formats.format import PromptFormat
from ssr_server.tools.base import Observation


def observation_text(fmt: PromptFormat, escape: Callable[[str], str], tool: str, obs: Observation,
                     images_before: int) -> str:
    """The observation for ``obs`` of ``tool``; ``obs.images`` will be images ``images_before``..."""
    o = fmt.observations
    if not obs.ok:
        return o.tool_error.format(reason=escape(obs.error or "unknown error"))
    if tool == "zoom":
        return o.zoom.format(index=images_before, placeholder=fmt.image_placeholder(images_before + 1))
    if tool == "image_search":
        if not obs.hits:
            return o.image_search_empty
        lines, n = [o.image_search_header], images_before
        for hit in obs.hits:
            lines.append(o.image_search_hit.format(title=escape(hit.title), url=escape(hit.url)))
            if hit.thumbnail is not None:
                placeholder = fmt.image_placeholder(n + 1)
                lines.append(o.image_search_thumbnail.format(index=n, placeholder=placeholder))
                n += 1
        return "\n".join(lines)
    if tool == "text_search":
        if not obs.hits:
            return o.text_search_empty
        return o.text_search_separator.join(
            o.text_search_hit.format(title=escape(h.title), url=escape(h.url), text=escape(h.text))
            for h in obs.hits)
    raise ValueError(f"no observation template for tool {tool!r}")


def invalid_action_text(fmt: PromptFormat, escape: Callable[[str], str], reason: str) -> str:
    return fmt.observations.invalid_action.format(reason=escape(reason))

"""What an image may be: bytes, pixels, where it may come from, and what the server keeps of it.

One value per app (built from the settings), shared by the HTTP routes, the batch runner and the image
search tool's uploads, so every entrance applies the same bounds.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 8 * 1024 * 1024
    max_pixels: int = 16_000_000
    allow_private: bool = False
    allowlist: tuple[str, ...] = ()
    timeout_s: float = 10.0
    max_redirects: int = 3
    keep_pixels: int | None = None  # downscale larger images to this many pixels; None keeps them as sent
    # Decodes at once (None: unbounded); shared by every request of one app.
    decode_slots: asyncio.Semaphore | None = field(default=None, compare=False, repr=False)

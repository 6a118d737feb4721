"""Progress bars (tqdm): live on a terminal; into a log file, one line every 30 s instead of a redraw
every 0.1 s (a 30-minute training run otherwise writes megabytes of carriage returns)."""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(**kwargs: Any) -> Any:
    from tqdm import tqdm

    if not sys.stderr.isatty():
        kwargs.setdefault("mininterval", 30.0)
        kwargs.setdefault("maxinterval", 60.0)
    return tqdm(**kwargs)

"""Hard limits, defined once: what the code can handle at all (and the run defaults beneath them).

Settings (``config.py``) may lower the per-deployment limits below these; the HTTP schemas, the
library loader, the run options and the SGLang route all read their bounds from here.
"""

from __future__ import annotations

MAX_CANDIDATES = 16  # rationales per library (or per request); the scorer packs them into one pass
MAX_CANDIDATE_CHARS = 400  # one rationale sentence
MAX_TURNS = 32  # turns per run
DEFAULT_MAX_TURNS = 6  # a run's turns when the caller does not say (a server's cap may be lower)
MAX_REASONING_TOKENS = 2048  # freeform reasoning budget per turn
DEFAULT_REASONING_TOKENS = 256  # freeform reasoning per turn when the caller does not say
MAX_TAU = 100.0
MAX_ALPHA = 10.0
MAX_SEED = 2**63 - 1
MAX_QUERY_CHARS = 120  # a text-search query the grammar lets the model write (xgrammar 0.2.7, SGLang 0.5.23's
# pin, fails to compile a pattern repetition of 150 or more: measured)
MAX_LABEL_CHARS = 40  # a zoom label
BOX_SCALE = 1000  # zoom boxes are in [0, BOX_SCALE] relative coordinates

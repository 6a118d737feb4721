"""The lowest layer: what every other part of the server shares and nothing here depends on.

The action table (``actions``), the one score formula and the selection defaults (``selection``),
rationale libraries (``library``), prompt formats (``formats``), the engine protocol and the records it
trades (``protocol``), image intake and URL fetching (``images``), answer matching (``answers``),
settings (``config``), the exception tree (``errors``), hard limits (``limits``) and the Prometheus
metrics (``metrics``). Nothing in ``core`` imports from ``engine``, ``tools``, ``agent``, ``api`` or
``cli`` (the import-linter contracts in pyproject.toml check it).
"""

"""The import contracts in pyproject.toml bite: the kinds of imports that eroded the layers before they
were checked (the lab reached from serving code, a lower layer importing an upper one, two sibling
modules importing each other, one engine importing the other) each break a contract.

``scripts/test.sh`` runs ``lint-imports`` on the real tree; this test runs the same contracts on a copy
of the packages with those imports added, so a contract that silently stopped matching anything would
fail here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (file, import added, what lint-imports reports about it)
INJECTED = [
    ("ssr_server/tools/registry.py", "import ssr_lab.world", "ssr_server.tools.registry -> ssr_lab.world"),
    ("ssr_server/core/library.py", "from ssr_server.agent import loop",
     "ssr_server.core.library -> ssr_server.agent.loop"),
    ("ssr_server/tools/zoom.py", "from ssr_server.api import errors",
     "ssr_server.tools.zoom -> ssr_server.api.errors"),
    ("ssr_server/core/images/urls.py", "from ssr_server.core.images import intake",
     "No cycles are allowed in ssr_server.core.images"),
    ("ssr_server/engine/torch/engine.py", "from ssr_server.engine.sglang import client",
     "ssr_server.engine.torch.engine -> ssr_server.engine.sglang.client"),
]


def test_each_kind_of_forbidden_import_breaks_a_contract(tmp_path: Path) -> None:
    for pkg in ("ssr_server", "ssr_lab"):
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns(
            "__pycache__", "*.safetensors", "*.png", "*.jpg", "*.jsonl", "tokenizer.json"))
    for rel, line, _ in INJECTED:
        with (tmp_path / rel).open("a", encoding="utf-8") as f:
            f.write(f"\n{line}  # noqa\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), str(REPO / "pyproject.toml"), "--no-cache"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    broken = {line.rsplit(" ", 1)[0] for line in out.splitlines() if line.endswith(" BROKEN")}
    assert len(broken) >= 4, out[-3000:]
    for start in ("The server never imports the lab", "Server layers", "Engines:", "No import cycles"):
        assert any(b.startswith(start) for b in broken), (start, broken)
    for _, _, reported in INJECTED:
        assert reported in out, (reported, out[-3000:])
    assert "Lab layers: each imports only the layers below it KEPT" in out  # nothing was added there

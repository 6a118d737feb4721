"""The wheel holds what the CLIs advertise, and the server stands without the lab.

Built as a user gets it: ``pip wheel`` of a clean checkout (the files git tracks, plus new ones it does
not ignore, copied to a fresh folder: no build outputs, no caches), installed into a fresh virtual
environment. Only the wheel is installed there (``--no-deps``); its dependencies come from the project's
venv through a ``.pth`` path line, which adds that site-packages to ``sys.path`` without running its
``.pth`` files, so the project's own editable install stays invisible and every ``ssr_server`` /
``ssr_lab`` import resolves to the wheel's copy (a test below checks exactly that).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("ssr_server", "ssr_lab")


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name

    @property
    def site_packages(self) -> Path:
        code = "import sysconfig; print(sysconfig.get_path('purelib'))"
        out = subprocess.run([str(self.python), "-c", code], capture_output=True, text=True, check=True)
        return Path(out.stdout.strip())


def _clean_checkout(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():  # a tracked file deleted in the working tree is not part of the checkout
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    kw.setdefault("cwd", "/")  # never the repository: `python -c` puts the working directory on sys.path
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, **kw)  # type: ignore[call-overload, no-any-return]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    checkout = tmp_path_factory.mktemp("checkout")
    _clean_checkout(checkout)
    dist = tmp_path_factory.mktemp("dist")
    # The venv's own setuptools builds it (no isolated build env: nothing to download).
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                  "--wheel-dir", str(dist), str(checkout)])
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = dist.glob("ssr_server-*.whl")
    venv = tmp_path_factory.mktemp("venv")
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert made.returncode == 0, made.stderr
    inst = Installed(wheel, venv)
    (inst.site_packages / "project-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    done = _run([sys.executable, "-m", "pip", "--python", str(inst.python), "install", "--no-deps", "-q",
                 str(wheel)])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return inst


def _tracked_sources() -> set[str]:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *PACKAGES],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return {f for f in files if (REPO / f).is_file() and "__pycache__" not in f}


def test_the_wheel_holds_every_source_file_and_the_package_data(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    missing = sorted(_tracked_sources() - names)
    assert not missing, f"{len(missing)} files of the packages are not in the wheel: {missing[:20]}"
    for data in ("ssr_server/models/ssr-tiny/model.safetensors", "ssr_server/tools/demo_world/manifest.json",
                 "ssr_server/tools/demo_world/questions.jsonl", "ssr_server/core/formats/ssr/format.yaml",
                 "ssr_server/candidates/default.yaml"):
        assert data in names, data
    assert any(n.startswith("ssr_lab/recipes/") and n.endswith(".yaml") for n in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    scripts = zipfile.ZipFile(installed.wheel).read(entry_points).decode()
    assert "ssr-server = ssr_server.cli:main" in scripts and "ssr-lab = ssr_lab.cli:main" in scripts


_WALK = r"""
import importlib, json, pkgutil, sys
import typer
from typer.testing import CliRunner
out = {"files": {}, "helps": {}, "imported": 0}
for pkg in sys.argv[1:]:
    mod = importlib.import_module(pkg)
    out["files"][pkg] = mod.__file__
    for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
        if info.name.endswith("__main__"):
            continue
        importlib.import_module(info.name)
        out["imported"] += 1
def walk(app, path, prog):
    res = CliRunner().invoke(app, [*path, "--help"], prog_name=prog)
    out["helps"][" ".join([prog, *path])] = (res.exit_code, res.output[-300:])
    sub = typer.main.get_command(app)
    for p in path:
        sub = sub.commands[p]
    if hasattr(sub, "commands"):  # a group (typer ships its own click)
        for name in sub.commands:
            walk(app, [*path, name], prog)
from ssr_server.cli import app as server
from ssr_lab.cli import app as lab
walk(server, [], "ssr-server")
walk(lab, [], "ssr-lab")
print(json.dumps(out))
"""


def test_every_module_imports_and_every_subcommand_helps_from_the_wheel(installed: Installed) -> None:
    proc = _run([str(installed.python), "-c", _WALK, *PACKAGES], cwd=installed.venv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    for pkg, path in found["files"].items():  # the wheel's copy, never the project's editable one
        assert Path(path).is_relative_to(installed.site_packages), (pkg, path)
    assert found["imported"] > 150
    helps = found["helps"]
    bad = {cmd: res for cmd, res in helps.items() if res[0] != 0}
    assert not bad, bad
    server = {c for c in helps if c.startswith("ssr-server")}
    lab = {c for c in helps if c.startswith("ssr-lab")}
    assert {"ssr-server serve", "ssr-server ask", "ssr-server infer", "ssr-server loadtest",
            "ssr-server bench scoring", "ssr-server sglang-launch", "ssr-server tiny-model"} <= server
    assert {"ssr-lab world build", "ssr-lab eval", "ssr-lab compare", "ssr-lab train sft",
            "ssr-lab train soup"} <= lab
    # The server's CLI lists no lab command: those are ssr-lab's.
    assert not any(c.split()[1] in {"world", "eval", "compare", "train"} for c in server if " " in c)
    for script in ("ssr-server", "ssr-lab"):
        proc = _run([str(installed.bin(script)), "--help"])
        assert proc.returncode == 0 and "Usage" in proc.stdout, proc.stderr[-2000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def server_without_lab(installed: Installed, tmp_path: Path) -> Iterator[str]:
    shutil.rmtree(installed.site_packages / "ssr_lab")
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "SSR_TORCH_THREADS": "1",
           "SSR_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("PYTHONPATH", None)
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen([str(installed.bin("ssr-server")), "serve", "--port", str(port)], cwd=tmp_path,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        else:
            raise AssertionError("no /ready: " + (tmp_path / "serve.log").read_text()[-3000:])
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def test_the_server_starts_and_answers_the_demo_question_without_the_lab(
        installed: Installed, server_without_lab: str, tmp_path: Path) -> None:
    gone = _run([str(installed.python), "-c", "import ssr_lab"])
    assert gone.returncode != 0 and "No module named 'ssr_lab'" in gone.stderr
    script = (
        "import shutil, sys\n"
        "from ssr_server.tools.demo import shipped_demo_world, showcase_question\n"
        "w = shipped_demo_world(); q = showcase_question(w.questions())\n"
        "shutil.copy(w.root / q.image, sys.argv[1])\n"
        "print('\\n'.join([q.question, q.answer, *q.aliases]))\n")
    image = tmp_path / "question.jpg"
    shown = _run([str(installed.python), "-c", script, str(image)])
    assert shown.returncode == 0, shown.stderr[-2000:]
    question, *gold = shown.stdout.strip().split("\n")
    asked = _run([str(installed.bin("ssr-server")), "ask", "--server", server_without_lab,
                  "--image", str(image), "--question", question, "--max-turns", "4", "--expect-answer",
                  *[a for g in gold for a in ("--gold", g)]])
    assert asked.returncode == 0, asked.stdout[-3000:] + asked.stderr[-3000:]
    assert "outcome: answered" in asked.stdout and "correct: " in asked.stdout, asked.stdout

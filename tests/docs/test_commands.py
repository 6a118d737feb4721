"""The docs cannot drift from the CLI: every ``ssr-server`` / ``ssr-lab`` command line they show parses.

Commands are taken from README.md, docs/**/*.md, the recipes' READMEs and the shipped model's card:
fenced code blocks (backslash-continued lines joined) and inline code spans (a span may wrap across a
line break). A command may start with ``VAR=value`` assignments and a ``.venv/bin/`` prefix, and may
sit after ``&&``, ``|`` or ``;``. Each is resolved against the real click command tree
(``typer.main.get_command``) and parsed with ``make_context(..., resilient_parsing=False)`` without
running it, so an unknown option, a missing required option or argument, a bad value or an unknown
subcommand fails with the file and line. Paths need not exist (existence checks are switched off on a
copy of each command). A command that elides arguments with ``...`` is still checked for its
subcommands, options and values, only not for missing required ones; the count of those is bounded.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main

try:  # typer vendors its own click (0.2x); older typers use click itself
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ("ssr-server", "ssr-lab")
# When this test was written the files held ~210 command lines (~150 of them parsed in full, ~55
# commands named without arguments, one elided). A drop below these floors means the extractor broke or
# the docs lost their commands, not that the docs improved.
MIN_COMMANDS = 120
MIN_FULLY_PARSED = 90
MAX_ELIDED_SHARE = 0.25

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_VENV_PREFIX = re.compile(r"^(?:\./)?\.venv/bin/")
_INLINE_CODE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
_STARTS_WITH_PROGRAM = re.compile(
    r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:(?:\./)?\.venv/bin/)?(?:" + "|".join(PROGRAMS) + r")(?:\s|$)")
_SEPARATORS = frozenset({"|", "||", "&&", ";", "&", "(", ")", ";;", "|&"})
_REDIRECT = re.compile(r"^\d*(?:>>?|<)&?\d*$")


class CommandError(Exception):
    """A documented command the CLI would refuse."""


@dataclass(frozen=True)
class DocCommand:
    """One ``ssr-server`` / ``ssr-lab`` command line found in a document."""

    path: Path
    line: int
    text: str
    program: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    elided: bool = False

    @property
    def where(self) -> str:
        try:
            return f"{self.path.relative_to(ROOT)}:{self.line}"
        except ValueError:
            return f"{self.path}:{self.line}"


# ---------------------------------------------------------------------------------------- extraction


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "ssr_lab" / "recipes").rglob("README.md")),
             ROOT / "ssr_server" / "models" / "ssr-tiny" / "README.md"]
    return [f for f in files if f.is_file()]


def _split_fences(text: str) -> tuple[list[tuple[int, str]], list[str]]:
    """The logical lines of fenced code (with their first line's number, backslash continuations
    joined) and the prose lines, where fenced lines are blanked so line numbers keep."""
    code: list[tuple[int, str]] = []
    prose: list[str] = []
    fence: str | None = None
    pending: tuple[int, str] | None = None
    for number, line in enumerate(text.split("\n"), start=1):
        match = _FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
                prose.append("")
            else:
                prose.append(line)
            continue
        prose.append("")
        stripped = line.strip()
        if match and stripped == stripped[0] * len(stripped) and stripped.startswith(fence):
            if pending is not None:
                code.append(pending)
                pending = None
            fence = None
            continue
        start, before = pending if pending is not None else (number, "")
        joined = f"{before} {stripped}".strip() if before else stripped
        if joined.endswith("\\"):
            pending = (start, joined[:-1].rstrip())
        else:
            pending = None
            code.append((start, joined))
    if pending is not None:
        code.append(pending)
    return code, prose


def _inline_spans(prose: list[str]) -> Iterator[tuple[int, str]]:
    """Inline code spans, paragraph by paragraph: a span may wrap across a line break, never across
    a blank line. Yields (line number of the span's start, its text with whitespace collapsed)."""
    start = 0
    while start < len(prose):
        if not prose[start].strip():
            start += 1
            continue
        end = start
        while end < len(prose) and prose[end].strip():
            end += 1
        paragraph = "\n".join(prose[start:end])
        for match in _INLINE_CODE.finditer(paragraph):
            line = start + 1 + paragraph.count("\n", 0, match.start())
            yield line, " ".join(match.group(2).split())
        start = end


def _tokens(snippet: str) -> list[str]:
    lexer = shlex.shlex(snippet, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def _segments(tokens: list[str]) -> Iterator[list[str]]:
    """Simple commands of a shell line: split at ``|``, ``&&``, ``;``, ``&``; redirections dropped."""
    segment: list[str] = []
    skip_next = False
    for token in tokens:
        if skip_next:
            skip_next = False
            continue
        if token in _SEPARATORS:
            yield segment
            segment = []
        elif _REDIRECT.match(token):
            skip_next = not token.endswith(tuple("0123456789"))
        else:
            segment.append(token)
    yield segment


def commands_in(snippet: str, path: Path, line: int) -> Iterator[DocCommand]:
    """Every ssr-server / ssr-lab command of one shell line or code span."""
    try:
        tokens = _tokens(snippet)
    except ValueError as exc:  # unbalanced quotes: not shell, unless it looks like one of our commands
        if _STARTS_WITH_PROGRAM.match(snippet):
            yield DocCommand(path, line, snippet, "?", (f"<cannot split: {exc}>",))
        return
    for segment in _segments(tokens):
        env: list[tuple[str, str]] = []
        i = 0
        while i < len(segment) and _ENV_ASSIGNMENT.match(segment[i]):
            name, value = segment[i].split("=", 1)
            env.append((name, value))
            i += 1
        if i >= len(segment):
            continue
        program = _VENV_PREFIX.sub("", segment[i])
        if program not in PROGRAMS:
            continue
        args = segment[i + 1:]
        elided = any("..." in a or "\u2026" in a for a in args)
        kept = tuple(a for a in args if "..." not in a and "\u2026" not in a)
        yield DocCommand(path, line, snippet, program, kept, tuple(env), elided)


def extract(path: Path, text: str | None = None) -> list[DocCommand]:
    """The commands a Markdown file shows, in fenced blocks first, then in inline code."""
    code, prose = _split_fences(path.read_text(encoding="utf-8") if text is None else text)
    found: list[DocCommand] = []
    for line, snippet in code:
        found.extend(commands_in(snippet, path, line))
    for line, snippet in _inline_spans(prose):
        found.extend(commands_in(snippet, path, line))
    return found


# ------------------------------------------------------------------------------------------ checking


@functools.cache
def root_command(program: str) -> Any:
    if program == "ssr-server":
        from ssr_server.cli import app
    elif program == "ssr-lab":
        from ssr_lab.cli import app
    else:
        raise CommandError(f"not a command of this project: {program!r}")
    return typer.main.get_command(app)


def _relaxed_param(param: Any) -> Any:
    """The parameter with its path-existence check off (documented paths need not exist here)."""
    descriptor = getattr(param, "type_descriptor", None)  # typer's own parameter types
    if descriptor is not None and getattr(descriptor.parameter_info, "exists", False):
        info = copy.copy(descriptor.parameter_info)
        info.exists = False
        param = copy.copy(param)
        param.type_descriptor = dataclasses.replace(descriptor, parameter_info=info)
    click_type = getattr(param, "type", None)  # click.Path, with a typer built on click
    if click_type is not None and getattr(click_type, "exists", False):
        param = copy.copy(param)
        param.type = copy.copy(click_type)
        param.type.exists = False
    return param


def _without_existence_checks(command: Any) -> Any:
    relaxed = copy.copy(command)
    relaxed.params = [_relaxed_param(p) for p in command.params]
    return relaxed


def _subcommands(node: Any) -> dict[str, Any] | None:
    commands = getattr(node, "commands", None)
    return commands if isinstance(commands, dict) else None


@contextlib.contextmanager
def _environment(assignments: tuple[tuple[str, str], ...]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name, _ in assignments}
    os.environ.update(dict(assignments))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def check(command: DocCommand) -> str:
    """Parse one documented command against the real CLI; raise ``CommandError`` if it would fail.

    Returns how it was checked: ``parsed`` (in full), ``elided`` (``...`` in it: required parameters
    not checked) or ``named`` (a command named without arguments: its path only).
    """
    node = root_command(command.program)
    path = [command.program]
    args = list(command.args)
    while (children := _subcommands(node)) is not None and args and not args[0].startswith("-"):
        sub = children.get(args[0])
        if sub is None:
            known = ", ".join(sorted(children))
            raise CommandError(f"`{' '.join(path)}` has no command {args[0]!r} (it has: {known})")
        node = sub
        path.append(args.pop(0))
    if not args:
        return "elided" if command.elided else "named"
    leaf = _without_existence_checks(node)
    sink = io.StringIO()
    with _environment(command.env), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        try:
            leaf.make_context(" ".join(path), list(args), resilient_parsing=False)
        except typer.Exit as exc:  # --help and the like
            if exc.exit_code:
                raise CommandError(f"`{' '.join(path)}` exits {exc.exit_code}") from None
        except click_exceptions.MissingParameter as exc:
            if not command.elided:
                raise CommandError(f"`{' '.join(path)}`: {exc.format_message()}") from None
        except click_exceptions.ClickException as exc:
            raise CommandError(f"`{' '.join(path)}`: {exc.format_message()}") from None
    return "elided" if command.elided else "parsed"


ALL_COMMANDS = [c for f in doc_files() for c in extract(f)]


# --------------------------------------------------------------------------------------------- tests


def test_every_documented_command_parses() -> None:
    failures = []
    for command in ALL_COMMANDS:
        try:
            check(command)
        except CommandError as exc:
            failures.append(f"{command.where}: {command.text}\n    -> {exc}")
    assert not failures, f"{len(failures)} documented command(s) the CLI refuses:\n" + "\n".join(failures)


def test_the_extractor_finds_a_realistic_number_of_commands() -> None:
    kinds = {"parsed": 0, "elided": 0, "named": 0, "refused": 0}
    for command in ALL_COMMANDS:
        try:
            kinds[check(command)] += 1
        except CommandError:
            kinds["refused"] += 1
    total = len(ALL_COMMANDS)
    summary = f"{total} commands in {len(doc_files())} files: {kinds}"
    assert total >= MIN_COMMANDS, summary
    assert kinds["parsed"] >= MIN_FULLY_PARSED, summary
    assert kinds["elided"] <= MAX_ELIDED_SHARE * total, summary
    programs = {c.program for c in ALL_COMMANDS}
    assert set(PROGRAMS) <= programs, summary


def _one(snippet: str) -> DocCommand:
    found = list(commands_in(snippet, ROOT / "example.md", 1))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize(("snippet", "message"), [
    ("ssr-server serve --no-such-flag", "no-such-flag"),
    ("ssr-server eval --world w --json x.json", "has no command 'eval'"),
    ("ssr-lab world build /tmp/w --entities many", "--entities"),
    ("ssr-lab compare only-one.json", "eval_b"),
    ("ssr-lab train soup runs/A runs/B", "--out"),
    ("ssr-server ask --image photo.jpg", "--question"),
])
def test_the_checker_refuses_what_the_cli_refuses(snippet: str, message: str) -> None:
    with pytest.raises(CommandError, match=re.escape(message)):
        check(_one(snippet))


@pytest.mark.parametrize("snippet", [
    "ssr-server serve --port 8000 &",
    ".venv/bin/ssr-server serve --model tiny-random --log-level warning",
    "SSR_TORCH_THREADS=1 SSR_MODEL=x ssr-lab eval --world /no/such/world --json out.json --limit 24",
    "ssr-lab compare /no/a.json /no/b.json --json /no/c.json",
    "ssr-server --help",
    "ssr-lab train",
])
def test_the_checker_accepts_what_the_cli_accepts(snippet: str) -> None:
    assert check(_one(snippet)) in {"parsed", "named"}


def test_an_elided_command_is_checked_for_its_options_only() -> None:
    elided = _one("ssr-lab eval ... --limit 240")
    assert elided.elided and check(elided) == "elided"
    with pytest.raises(CommandError, match="no-such"):
        check(_one("ssr-lab eval ... --no-such 1"))


def test_the_extractor_reads_fences_continuations_and_wrapped_spans(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    text = "\n".join([
        "# A page",
        "",
        "Run `ssr-server serve",
        "--port 8000` first, then `ssr-lab compare a.json b.json`.",
        "",
        "```bash",
        "SSR_TORCH_THREADS=1 .venv/bin/ssr-lab eval --world w \\",
        "    --json x.json   # a comment",
        "cd /tmp && ssr-server ask --question 'What is this?' --image p.png | tee out.txt",
        "echo ssr-server is not a command here",
        "```",
        "",
        "````text",
        "```",
        "ssr-server bench serve --runs 48",
        "````",
        "`not ssr-server serve`",
    ])
    found = extract(doc, text)
    assert [(c.line, c.program, c.args) for c in found] == [
        (7, "ssr-lab", ("eval", "--world", "w", "--json", "x.json")),
        (9, "ssr-server", ("ask", "--question", "What is this?", "--image", "p.png")),
        (15, "ssr-server", ("bench", "serve", "--runs", "48")),
        (3, "ssr-server", ("serve", "--port", "8000")),
        (4, "ssr-lab", ("compare", "a.json", "b.json")),
    ]
    assert found[0].env == (("SSR_TORCH_THREADS", "1"),)
    assert all(check(c) == "parsed" for c in found)

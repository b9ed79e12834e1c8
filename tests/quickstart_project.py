"""The quickstart's own blocks (docs/quickstart.md), read the way a new user copies them.

Each code block on the page follows a marker, an HTML comment that a page renders as
nothing: ``<!-- quickstart: write PATH -->`` (the file's whole text),
``<!-- quickstart: append PATH [sqlite|postgres] -->`` (added at the end, on one
database only when named) and ``<!-- quickstart: run -->`` (shell commands, in order).
The tests build a project from exactly these blocks, so the page cannot drift.
Another page that builds a project (docs/streams.md) marks its blocks
``<!-- project: ... -->`` the same way, and its short snippets that belong to no file
``<!-- project: show -->``.
"""

import importlib.metadata
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "quickstart.md"
BLOCK = re.compile(
    r"(?:<!-- (?:quickstart|project): (?P<marker>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```",
    re.S,
)


@dataclass
class Block:
    action: str  # "write", "append" or "run"
    path: str | None
    database: str | None  # "sqlite", "postgres" or None (both)
    body: str


def blocks(page: Path = PAGE) -> list[Block]:
    found = []
    for match in BLOCK.finditer(page.read_text()):
        marker = match["marker"]
        assert marker, f"a code block of {page.name} without a quickstart marker:\n{match[0]}"
        action, *rest = marker.split()
        assert action in ("write", "append", "run", "show"), marker
        path = rest[0] if action in ("write", "append") else None
        database = rest[1] if len(rest) > 1 else None
        assert database in (None, "sqlite", "postgres"), marker
        body = match["body"]
        if path:
            # What a reader sees first: the file the block belongs in.
            comment = "<!--" if match["lang"] == "html" else "#"
            assert body.startswith(f"{comment} {path}"), (path, body.splitlines()[0])
        found.append(Block(action, path, database, body))
    return found


def split(block: Block) -> list[list[str]]:
    """The commands of a ``run`` block, split like a shell splits them."""
    lines = (shlex.split(line, comments=True) for line in block.body.splitlines())
    return [words for words in lines if words]


def commands(page: Path = PAGE) -> list[list[str]]:
    """Every command of the page's ``run`` blocks, split like a shell splits it."""
    return [words for block in blocks(page) if block.action == "run" for words in split(block)]


def write_files(
    project: Path, database: str, replace: dict[str, str] | None = None, page: Path = PAGE
) -> None:
    """The page's ``write`` and ``append`` blocks for ``database``, in page order, after
    ``startproject`` and ``startapp`` made the directory. ``replace`` swaps literal
    text (a database name a test must not share)."""
    for block in blocks(page):
        if block.action not in ("run", "show"):
            write_block(project, block, database, replace)


def write_block(
    project: Path, block: Block, database: str, replace: dict[str, str] | None = None
) -> None:
    """One ``write`` or ``append`` block (nothing when it is the other database's)."""
    if block.database not in (None, database):
        return
    text = block.body
    for old, new in (replace or {}).items():
        text = text.replace(old, new)
    target = project / block.path
    target.parent.mkdir(parents=True, exist_ok=True)
    if block.action == "write":
        target.write_text(text)
    else:
        assert target.exists(), f"{block.path}: the page appends to a file nothing made"
        target.write_text(target.read_text() + "\n\n" + text)


def start_project(python: str, project: Path, env: dict, page: Path = PAGE) -> None:
    """The page's ``django-admin startproject`` and ``manage.py startapp`` lines."""
    for words in commands(page):
        start_command(python, project, env, words)


def start_command(python: str, project: Path, env: dict, words: list[str]) -> bool:
    """Run ``words`` if it is the page's ``startproject`` or ``startapp``; say if it was."""
    if words[0] == "django-admin":
        assert words[1] == "startproject", words
        run([python, "-m", "django", *words[1:]], project, env)
    elif words[:3] == ["python", "manage.py", "startapp"]:
        run([python, *words[1:]], project, env)
    else:
        return False
    return True


def run(args, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (args, result.stdout[-3000:], result.stderr[-3000:])
    return result


def build_wheel(source: Path, out: Path) -> Path:
    """``pip wheel`` of a copy of the sources, offline (``--no-build-isolation``, with
    the setuptools the ``test`` extra installs): no build leaves files in the work tree
    and a stale ``build/`` there can't hide a missing file."""
    major = int(importlib.metadata.version("setuptools").split(".")[0])
    assert major >= 77, "the test extra installs setuptools>=77: pip install -e '.[test]'"
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "django_durable",
        source / "django_durable",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    [built] = out.glob("django_durable_workflows-*.whl")
    return built

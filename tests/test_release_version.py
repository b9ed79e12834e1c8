"""The version is written once per place a reader looks, and they agree, read from
the repository's files (never from git, so an sdist passes): ``pyproject.toml``'s
version has a ``CHANGELOG.md`` entry with its "Upgrading" notes, and it is the
newest entry."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def changelog_entries() -> list[tuple[str, str]]:
    """(version, text) of each ``## [X.Y.Z]`` entry, newest first."""
    text = (ROOT / "CHANGELOG.md").read_text()
    parts = re.split(r"^## \[([^\]]+)\][^\n]*$", text, flags=re.M)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts), 2) if parts[i] != "Unreleased"]


def test_the_version_has_the_newest_changelog_entry_with_upgrade_notes():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    entries = changelog_entries()
    assert entries, "CHANGELOG.md has no release entry"
    newest, text = entries[0]
    assert newest == version, (newest, version)
    assert "### Upgrading" in text
    versions = [tuple(int(n) for n in v.split(".")) for v, _text in entries]
    assert versions == sorted(versions, reverse=True)

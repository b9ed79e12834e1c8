"""Pin the migrations of a release being tagged: every file of django_durable/migrations/
(the migrations and their sql/) with its SHA-256, under the release's version, in
django_durable/migrations/RELEASED.json. Run it in the release's commit, before the tag:

    python scripts/pin_release.py 0.3.0

A file a release pinned never changes (tests/test_release_rules.py); docs/contributing.md
says how a release's schema change is written."""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from pathlib import Path

MIGRATIONS = Path(__file__).resolve().parent.parent / "django_durable" / "migrations"
MANIFEST = MIGRATIONS / "RELEASED.json"


def replaced() -> set[str]:
    """The drafts a squashed migration replaces (its ``replaces`` list): kept only until
    the next release deletes them, so never pinned."""
    names = set()
    for path in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py"):
        for node in ast.parse(path.read_text()).body:
            for item in getattr(node, "body", []):
                if (
                    isinstance(item, ast.Assign)
                    and getattr(item.targets[0], "id", "") == "replaces"
                ):
                    names |= {name for _app, name in ast.literal_eval(item.value)}
    return names


def shipped() -> dict[str, str]:
    """Each migration file and function text of the tree, by path under migrations/
    (but the drafts a squashed migration replaces)."""
    drafts = replaced()
    files = sorted(
        path for path in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py") if path.stem not in drafts
    ) + sorted((MIGRATIONS / "sql").glob("*.sql"))
    return {
        path.relative_to(MIGRATIONS).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in files
    }


def main(version: str) -> None:
    manifest = json.loads(MANIFEST.read_text())
    if version in manifest["releases"]:
        raise SystemExit(f"{version} is pinned already: a pinned release never changes")
    manifest["releases"][version] = shipped()
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"pinned {len(manifest['releases'][version])} files for {version}")


if __name__ == "__main__":
    main(sys.argv[1])

"""The release rules of docs/contributing.md that can be read from the files, without
git (an sdist has none):

- a file of migrations/ that a tagged release pinned (migrations/RELEASED.json,
  written by scripts/pin_release.py) is unchanged and still there;
- the migrations leave at most two versions of each database function installed
  (created by a migration's ``FUNCTIONS``, dropped by a later one's ``DROPPED``);
- a migration made after the last tag is named by its release and kind
  (``0007_0_4_expand_run_labels``), and touches the hot tables only as an expand
  migration may: indexes ``CONCURRENTLY``, other DDL under a lock timeout.

What a migration may import is tests/test_architecture.py's rule. The last two rules
hold from the first tagged release on: before it, the drafts are folded anyway."""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MIGRATIONS = ROOT / "django_durable" / "migrations"
RELEASES: dict[str, dict[str, str]] = json.loads((MIGRATIONS / "RELEASED.json").read_text())[
    "releases"
]
PINNED = {path for files in RELEASES.values() for path in files}
HOT_MODELS = {"run", "stepattempt"}
NAME = re.compile(r"^\d{4}_\d+_\d+(_\d+)?_(expand|contract)_\w+$")
before_the_first_release = pytest.mark.xfail(
    not RELEASES,
    reason="drafts before the first tag (four claim versions, plain indexes): folded at 0.3.0",
    strict=True,
)


def replaced() -> set[str]:
    """The drafts a squashed migration replaces: history of main before a tag, not of
    a release (the next release deletes them)."""
    names = set()
    for path in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "replaces":
                names |= {name for _app, name in ast.literal_eval(node.value)}
    return names


def migration_files() -> list[Path]:
    """The release's migrations (but the drafts a squashed migration replaces)."""
    drafts = replaced()
    return sorted(
        path for path in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py") if path.stem not in drafts
    )


def named_list(path: Path, variable: str) -> list[str]:
    """The strings of a module-level ``variable = [...]`` of a migration, or []."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == variable for t in node.targets
        ):
            return [ast.literal_eval(e) for e in node.value.elts]
    return []


def installed_versions() -> dict[str, list[str]]:
    """Each function's versions that the migrations leave installed, by name."""
    installed: list[str] = []
    for path in migration_files():
        installed += named_list(path, "FUNCTIONS")
        installed = [v for v in installed if v not in named_list(path, "DROPPED")]
    versions: dict[str, list[str]] = {}
    for versioned in installed:
        versions.setdefault(versioned.rsplit("_v", 1)[0], []).append(versioned)
    return versions


def test_every_pinned_file_is_unchanged():
    for version, files in RELEASES.items():
        for path, digest in files.items():
            found = MIGRATIONS / path
            assert found.exists(), f"{path}, pinned by {version}, is gone"
            assert hashlib.sha256(found.read_bytes()).hexdigest() == digest, (
                f"{path} changed since {version} pinned it: a released migration or "
                "function is never edited (docs/contributing.md)"
            )


def test_the_function_lists_are_read():
    versions = installed_versions()
    assert "durable_start" in versions and "durable_claim" in versions


def test_at_most_two_versions_of_a_function_are_installed():
    assert {name: v for name, v in installed_versions().items() if len(v) > 2} == {}


def unpinned_migrations() -> list[Path]:
    return [p for p in migration_files() if p.relative_to(MIGRATIONS).as_posix() not in PINNED]


@before_the_first_release
def test_a_migration_after_the_last_tag_is_named_by_its_release_and_kind():
    assert [p.stem for p in unpinned_migrations() if not NAME.match(p.stem)] == []


def plain_hot_operations(path: Path) -> list[str]:
    """The operations of a migration that would lock a hot table with no bound: one
    on durable_run or the attempt table that is neither an ``AddIndexConcurrently``
    nor inside a ``WithLockTimeout(...)``."""
    tree = ast.parse(path.read_text())
    bounded = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "WithLockTimeout"
        for inner in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in bounded:
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        model = next(
            (ast.literal_eval(k.value) for k in node.keywords if k.arg == "model_name"), None
        )
        if model in HOT_MODELS and name != "AddIndexConcurrently":
            found.append(f"{path.stem}: {name}({model})")
    return found


def test_the_hot_table_check_tells_a_bounded_migration_from_a_plain_one(tmp_path):
    throwaway = ROOT / "tests" / "upgrade_migrations" / "9000_0_4_expand_next_release.py"
    assert NAME.match(throwaway.stem)
    assert plain_hot_operations(throwaway) == []
    plain = tmp_path / "0009_0_4_expand_plain.py"
    plain.write_text(
        "operations = [migrations.AddIndex(model_name='run', index=models.Index("
        "fields=['queue'], name='durable_run_queue'))]\n"
    )
    assert plain_hot_operations(plain) == ["0009_0_4_expand_plain: AddIndex(run)"]


@before_the_first_release
def test_a_migration_after_the_last_tag_never_locks_a_hot_table_unbounded():
    assert [op for p in unpinned_migrations() for op in plain_hot_operations(p)] == []

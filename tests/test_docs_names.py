"""The docs name only migrations and database function versions that exist.

README.md, CHANGELOG.md and docs/*.md are read for migration files
(``0003_flow_control``), migration numbers where a paragraph speaks of migrations
("migration 0012", "0002 to 0004") and function versions (``durable_start_v2``);
each must be a file of ``django_durable/migrations`` (a migration, or a function's
text in ``sql/``). The names are read from that directory, so a fold
or a rename that leaves a doc behind fails here. CHANGELOG.md may keep the names of
its past under a marked section (``HISTORIC_BEGIN`` ... ``HISTORIC_END``)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MIGRATIONS = ROOT / "django_durable" / "migrations"
# The release test's throwaway next-release migrations, which the docs name by path.
UPGRADE_MIGRATIONS = ROOT / "tests" / "upgrade_migrations"
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]

# Made-up names a doc uses as examples of files a later release would add.
EXAMPLES = {
    "docs/contributing.md": {
        "0007_0_4_expand_run_labels",
        "0008_0_5_contract_claim_v5",
        "durable_claim_v6",
    },
}
HISTORIC_BEGIN = "<!-- historic names -->"
HISTORIC_END = "<!-- end of historic names -->"

FUNCTION = re.compile(r"\bdurable_[a-z_]+?_v\d+\b")
MIGRATION_FILE = re.compile(r"(?<![\w/.])\d{4}_\w*[a-z]\w*")
# A migration's number on its own: four digits from 0 (not in 0.0012, 10012 or a
# year, not a file's prefix).
NUMBER = re.compile(r"(?<![\w.,])0\d{3}(?![\w]|[.,]\d)")


def known_names() -> tuple[set[str], set[str]]:
    """The migrations (file stems) and function versions the package has."""
    files = [p for p in MIGRATIONS.glob("*.py") if p.stem != "__init__"]
    migrations = {p.stem for p in files}
    migrations |= {p.stem for p in UPGRADE_MIGRATIONS.glob("*.py") if p.stem != "__init__"}
    # A function version exists while its text does (a migration may still name one
    # it drops: the release's last draft drops the drafts' versions).
    functions = {p.stem for p in (MIGRATIONS / "sql").glob("*.sql")}
    return migrations, functions


def unknown_names(
    text: str, migrations: set[str], functions: set[str], *, historic: bool = False
) -> list[str]:
    """Each name in ``text`` (Markdown) that is neither a migration nor a function
    version of ``migrations`` and ``functions``; with ``historic``, none is looked
    for in the marked sections."""
    if historic:
        marked = rf"{re.escape(HISTORIC_BEGIN)}.*?{re.escape(HISTORIC_END)}"
        text = re.sub(marked, "", text, flags=re.S)
    numbers = {name[:4] for name in migrations}
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        found += [f for f in FUNCTION.findall(paragraph) if f not in functions]
        stems = [m.removesuffix(".py") for m in MIGRATION_FILE.findall(paragraph)]
        found += [m for m in stems if m not in migrations]
        if re.search(r"migrat", paragraph, re.I):
            found += [f"migration {n}" for n in NUMBER.findall(paragraph) if n not in numbers]
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_docs_name_only_migrations_and_functions_that_exist(path):
    migrations, functions = known_names()
    allowed = EXAMPLES.get(str(path.relative_to(ROOT)), set())
    historic = path.name == "CHANGELOG.md"
    found = unknown_names(path.read_text(), migrations, functions, historic=historic)
    assert [name for name in found if name not in allowed] == []


def test_a_planted_name_is_found():
    migrations = {"0001_initial", "0002_replay_and_repair"}
    functions = {"durable_start_v1", "durable_claim_v4"}
    text = f"""# Upgrading

Migration 0012 adds an index; `0003_flow_control.py` adds the flow key, and
0001 to 0002 are drafts. A start calls `durable_start_v3`; `durable_claim_v4` claims.

In 2026 a migration took 0.0012 s for 1000 runs; `0001_initial` and 0002 exist,
0099 does not.

Nothing about schemas here: 0099 runs.

{HISTORIC_BEGIN}
Migration 0020 and `durable_claim_v1` were folded.
{HISTORIC_END}
"""
    planted = ["durable_start_v3", "0003_flow_control", "migration 0012", "migration 0099"]
    assert unknown_names(text, migrations, functions, historic=True) == planted
    # Outside CHANGELOG.md a marked section is read like the rest.
    assert unknown_names(text, migrations, functions) == [
        *planted,
        "durable_claim_v1",
        "migration 0020",
    ]

"""One engine per database (store/engines): the rules its layout promises, read from
the source. Only the engine's selection asks which database it is; every statement
is one literal with a comment; both engines name the same statements; the runs
table's columns and the claimable statuses are defined once; nothing in the store
decides from a run's state."""

import ast
import pathlib
import re

from django.db import connection

from django_durable.models import CLAIMABLE_STATUSES, Run
from django_durable.store import base
from django_durable.store.engines import ENGINES, for_connection, postgres, sqlite

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "django_durable"
ENGINE_DIR = PACKAGE / "store" / "engines"


def sources():
    """Every module of the package but the frozen migrations, by path."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" not in path.parts:
            yield path, path.read_text()


def test_only_the_engine_selection_asks_for_the_vendor():
    asking = re.compile(r"vendor\s*[!=]=|is_postgres\(")
    found = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for path, text in sources()
        for n, line in enumerate(text.splitlines(), 1)
        if asking.search(line)
    ]
    assert found == ["store/engines/__init__.py:33"]


def test_the_engine_is_chosen_once_per_alias():
    chosen = for_connection(connection)
    assert chosen is (postgres if connection.vendor == "postgresql" else sqlite)
    assert for_connection(connection) is chosen and base.engine() is chosen


def statements(module) -> dict[str, ast.Assign]:
    """The engine module's upper-case names (statements and what it does), by name."""
    tree = ast.parse(pathlib.Path(module.__file__).read_text())
    return {
        node.targets[0].id: node
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id.isupper()
    }


def test_both_engines_name_the_same_statements():
    assert set(statements(postgres)) == set(statements(sqlite))
    for name in statements(postgres):
        for engine in ENGINES:
            value = getattr(engine, name)
            assert value is None or isinstance(value, str | bool), (engine.NAME, name)


def test_every_statement_is_one_literal_with_a_comment_above_it():
    for engine in ENGINES:
        lines = pathlib.Path(engine.__file__).read_text().splitlines()
        for name, node in statements(engine).items():
            value = node.value
            literal = isinstance(value, ast.Constant) or (
                # A statement the other engine runs unchanged, taken from it.
                isinstance(value, ast.Attribute) and ast.unparse(value) == f"postgres.{name}"
            )
            assert literal, f"{engine.NAME}.{name} is assembled, not one literal"
            above = lines[node.lineno - 2].strip()
            assert above.startswith("#"), f"{engine.NAME}.{name} has no comment above it"


def test_the_runs_columns_are_defined_once():
    columns = tuple(field.column for field in Run._meta.concrete_fields)
    assert columns == base.RUN_COLUMNS
    # The statements that must name every column (an INSERT of a whole run, the claim's
    # columns) name exactly these, in this order; no other module writes them out.
    for name in ("INSERT_RUN", "HAND_OFF", "START_BATCH"):
        statement = getattr(postgres, name)
        listed = statement.split("INSERT INTO durable_run (", 1)[1].split(")", 1)[0]
        assert tuple(c.strip().strip('"') for c in listed.split(",")) == columns, name
    spelled = re.compile(r'"?rerun_of_id"?,\s*"?rerun_from_step"?,\s*"?inputs"?')
    outside = [
        str(path.relative_to(PACKAGE))
        for path, text in sources()
        if spelled.search(text) and path.parent != ENGINE_DIR
    ]
    assert outside == []


def test_the_claimable_statuses_are_defined_once():
    """The model defines them (and the claim index's condition from them); a statement
    repeats the index's condition literally, as the planner needs, and only the
    engines hold statements."""
    condition = "status IN ({}) AND due_at IS NOT NULL".format(
        ", ".join(f"'{status}'" for status in CLAIMABLE_STATUSES)
    )
    literal = re.compile(r"IN \('pending', 'waiting', 'compensating'\)")
    for path, text in sources():
        if path.parent == ENGINE_DIR:
            for match in literal.finditer(text):
                line = text[text.rfind("\n", 0, match.start()) + 1 : text.find("\n", match.end())]
                assert condition in line or "durable_run.status IN" in line, line
        else:
            assert not literal.search(text), path
    python_spelling = re.compile(r"Status\.PENDING, Status\.WAITING, Status\.COMPENSATING")
    spelled = [str(p.relative_to(PACKAGE)) for p, text in sources() if python_spelling.search(text)]
    assert spelled == ["models.py"]


def test_the_statuses_that_hold_a_worker_are_defined_once():
    """``models.HELD_STATUSES`` (and ``HOLDS_WORKER`` from it): no module spells them
    again in Python; the engines' statements spell them in SQL."""
    spelled = re.compile(r"Status\.RUNNING, Status\.COMPENSATING")
    found = [str(p.relative_to(PACKAGE)) for p, text in sources() if spelled.search(text)]
    assert found == ["models.py"]


# Where a run's state is decided: the modules of operations that read it.
STATE_MODULES = ("state", "replay")


def test_nothing_in_the_store_decides_from_a_runs_state():
    """The store writes; operations decide: no store module imports the modules that
    decide from a run's state (operations/state.py, operations/replay.py), nor any
    of operations."""
    assert all((PACKAGE / "operations" / f"{name}.py").exists() for name in STATE_MODULES)
    importing = re.compile(
        r"django_durable\.operations\b|from django_durable import [^\n]*\boperations\b"
    )
    for name in STATE_MODULES:
        assert importing.search(f"from django_durable.operations import {name}")
    found = [
        str(path.relative_to(PACKAGE))
        for path, text in sources()
        if path.is_relative_to(PACKAGE / "store") and importing.search(text)
    ]
    assert found == []


def test_no_row_lock_is_taken_outside_the_store():
    locking = [
        str(path.relative_to(PACKAGE))
        for path, text in sources()
        if "select_for_update" in text and not path.is_relative_to(PACKAGE / "store")
    ]
    assert locking == []

"""The package's shape: every subpackage and top-level module has a place in one table
of layers and imports point down it only (migrations too: they name nothing of the
package but what Django must), no import cycle, no write in operations (the store
writes), small modules, and only public interfaces of Django and psycopg."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "django_durable"
ROOT = PACKAGE.parent

# Every unit of the package (a subpackage, or a module at its top) and the units it
# may import: arrows point down this table, and a unit always uses itself. Imports
# under ``if TYPE_CHECKING:`` are not arrows (``workflows.definition`` names
# ``runtime.context.Context`` in a step's type, for type checkers only). A unit
# missing here fails ``test_every_unit_has_a_place``: a new module gets a row.
BASE = {"conf", "exceptions", "signals"}
UNITS = {
    # What Django and projects load; they compose the layers below.
    # The package itself: its public names load lazily (operations, runtime.context,
    # stream_response, by ``import_module`` on first use).
    "django_durable": {"workflows", "operations", "runtime", "sse"} | BASE,
    # ready(); the tasks backend by ``import_module`` when TASKS names it.
    "apps": {"checks", "operations", "store", "tasks", "telemetry"} | BASE,
    "urls": {"admin", "dashboard"},
    "admin": {"dashboard", "models", "workflows"} | BASE,
    "management": {"django_durable", "cli", "operations", "runtime", "workflows"} | BASE,
    "tasks": {"django_durable", "workflows"} | BASE,  # the Django tasks backend
    "testing": {"operations", "runtime", "store", "workflows", "models"} | BASE,
    "cli": {"django_durable", "dashboard", "operations", "workflows", "store", "query"}
    | {"stats", "health", "models"}
    | BASE,
    # The admin pages: the public operations and the read side, never the store.
    "dashboard": {"django_durable", "operations", "workflows", "query", "stats", "health"}
    | {"models"}
    | BASE,
    "templatetags": set(),
    # stream_response: Server-Sent Events from the stream readers.
    "sse": {"runtime", "operations", "models"} | BASE,
    # The worker: runs steps (Context and the waits live here), decides nothing alone.
    "runtime": {"operations", "workflows", "store", "telemetry", "checks", "models"} | BASE,
    # What the public API does, and the policy: key rules, waits, wakes, compensation.
    "operations": {"workflows", "store", "telemetry", "models"} | BASE,
    # The workflows' declared flow limits: what its flow metrics count by.
    "telemetry": {"store", "workflows", "models"} | BASE,
    "checks": {"workflows"} | BASE,
    # The read side: questions and numbers for pages and people, through the store.
    "query": {"store", "models"} | BASE,
    "stats": {"query", "store", "models"} | BASE,
    "health": {"store", "models"} | BASE,
    "activity": {"models"},
    # Definitions only: no store, no operations, no runtime, no statement.
    "workflows": BASE,
    # Every statement and row lock; knows no policy, no run state, no worker.
    "store": {"models", "db_functions"} | BASE,
    "routers": {"conf"},
    "models": {"conf", "db_functions", "managers", "flow_models", "stream_models"},
    "stream_models": {"db_functions", "managers"},  # streams' tables
    "flow_models": {"managers"},  # flow control's table and Run's indexes for it
    "managers": {"conf"},  # the manager of every table (models and flow_models)
    "db_functions": set(),
    "conf": set(),
    "exceptions": set(),
    "signals": set(),
    # Frozen history: nothing of the package but what Django names by its path.
    "migrations": {"db_functions"},
}
# What a migration may name of the package (``django_durable.db_functions`` says why
# it never moves); anything else it imports or names of the package fails.
MIGRATIONS_MAY_NAME = {"django_durable.db_functions.OctetLength"}
MIGRATIONS = PACKAGE / "migrations"


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports_of(name: str, path: pathlib.Path, known: dict) -> set[str]:
    """The package's modules ``name`` imports at import time (TYPE_CHECKING excluded)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).split(".")[-1] == "TYPE_CHECKING":
            skipped.update(id(n) for part in node.body for n in ast.walk(part))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            found.update(subs if len(subs) == len(node.names) else [target, *subs])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif is_dynamic_import(node):
            # ``import_module("django_durable.x")`` is an arrow as ``import`` is; one
            # whose argument is computed imports any module the file names in a string.
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
            else:
                found.update(
                    n.value
                    for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                )
    return {m for m in found if m in known and m != name}


def is_dynamic_import(node: ast.AST) -> bool:
    """``importlib.import_module(...)``, ``import_module(...)`` or ``__import__(...)``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute | ast.Name)
        and ast.unparse(node.func).rpartition(".")[2] in ("import_module", "__import__")
    )


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def unit(name: str) -> str:
    """The row of ``UNITS`` a module of the package belongs to."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    cycles = []

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif not state.get(nxt):
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(edges):
        if not state.get(node):
            visit(node, [node])
    return cycles


def test_no_import_cycle():
    assert import_cycles(graph()) == []


def wrong_arrows(edges: dict[str, set[str]]) -> list[str]:
    wrong = []
    for name, targets in edges.items():
        own = unit(name)
        for target in targets:
            other = unit(target)
            if other == own or other in UNITS.get(own, set()):
                continue
            wrong.append(f"{name} -> {target}")
    return sorted(wrong)


def test_every_unit_has_a_place():
    units = {unit(name) for name in modules()} | {"migrations"}
    assert units - UNITS.keys() == set()
    assert UNITS.keys() - units == set()  # no row for a unit that is gone


def test_layers_import_only_downwards():
    assert wrong_arrows(graph()) == []


@pytest.mark.parametrize(
    "planted",
    [
        'import importlib\nflow = importlib.import_module("django_durable.operations.flow")\n',
        'from importlib import import_module\nNAME = "django_durable.operations.flow"\n'
        "flow = import_module(NAME)\n",
        'flow = __import__("django_durable.operations.flow")\n',
    ],
)
def test_the_layer_and_cycle_checks_see_an_import_module_call(tmp_path, planted):
    """A store -> operations call through ``importlib`` is an arrow up, and a cycle
    (operations import the store's face), however the module is named."""
    path = tmp_path / "planted.py"
    path.write_text(planted)
    known = modules()
    edges = graph()
    edges["django_durable.store"] |= imports_of("django_durable.store", path, known)
    assert wrong_arrows(edges) == ["django_durable.store -> django_durable.operations.flow"]
    assert any("django_durable.operations.flow" in cycle for cycle in import_cycles(edges))


def test_the_table_forbids_the_arrows_it_must():
    """The arrows the layering exists to forbid are not in the table."""
    forbidden = {
        "workflows": {"store", "operations", "runtime", "models", "dashboard"},
        "dashboard": {"store", "runtime"},
        "store": {"operations", "runtime", "workflows", "dashboard", "query", "stats"},
        "query": {"operations", "runtime", "dashboard"},
        "stats": {"operations", "runtime", "dashboard"},
        "health": {"operations", "runtime", "dashboard"},
        "operations": {"runtime", "dashboard", "cli"},
        "migrations": set(UNITS) - {"db_functions"},
    }
    allowed = {own: UNITS[own] & others for own, others in forbidden.items()}
    assert allowed == dict.fromkeys(forbidden, set())


def migration_files() -> list[pathlib.Path]:
    return sorted(MIGRATIONS.rglob("*.py"))


def package_names_used(path: pathlib.Path) -> set[str]:
    """What ``path`` imports or names of the package, at any depth: ``import x``,
    ``from x import y`` (a relative one as ``.x``), ``importlib.import_module``, and
    every dotted name under ``django_durable``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found |= {f"{module}.{alias.name}".replace("..", ".") for alias in node.names}
        elif is_dynamic_import(node):
            found.add("<dynamic import>")
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            found.add(ast.unparse(node))
    ours = {name for name in found if name.startswith((".", "django_durable", "<dynamic"))}
    # ``import a.b.c`` binds ``a``; a name is the longest dotted chain, not its prefixes.
    return {name for name in ours if not any(o.startswith(name + ".") for o in ours)}


def test_migrations_name_nothing_of_the_package_but_what_django_must():
    assert migration_files()
    assert {unit(name) for name in MIGRATIONS_MAY_NAME} <= UNITS["migrations"]
    named = {
        f"{path.relative_to(MIGRATIONS)}: {name}"
        for path in migration_files()
        for name in package_names_used(path) - MIGRATIONS_MAY_NAME
    }
    assert named == set()


def test_the_migration_check_sees_every_way_of_importing(tmp_path):
    """The check above would see the imports migrations 0013-0020 made before 0.2."""
    path = tmp_path / "0002_x.py"
    path.write_text(
        "import importlib\n"
        "from django_durable.store.functions import installing\n"
        "import django_durable.db_types\n"
        "import django_durable.db_functions\n"
        "def f():\n    from . import other\n"
        "m = importlib.import_module('django_durable.migrations.0001_initial')\n"
        "x = django_durable.db_types.RunStatusField()\n"
        "y = django_durable.db_functions.OctetLength('key')\n"
    )
    assert package_names_used(path) - MIGRATIONS_MAY_NAME == {
        "django_durable.store.functions.installing",
        ".other",
        "<dynamic import>",
        "django_durable.db_types.RunStatusField",
    }


def test_no_function_level_import_of_the_package():
    late = []
    for name, path in modules().items():
        if name == "django_durable.apps":
            continue  # AppConfig.ready() imports, as Django asks
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ImportFrom) and (
                        inner.level or (inner.module or "").startswith("django_durable")
                    ):
                        late.append(f"{name}:{inner.lineno}")
    assert late == []


def test_private_names_stay_inside_their_package():
    crossing = []
    for name, path in modules().items():
        package = name.rpartition(".")[0] if path.name != "__init__.py" else name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                source = node.module
                for alias in node.names:
                    if (
                        alias.name.startswith("_")
                        and not source.startswith(package + ".")
                        and (source != package)
                    ):
                        crossing.append(f"{name} imports {source}.{alias.name}")
    assert crossing == []


def test_only_public_interfaces_of_django_and_psycopg():
    forbidden = re.compile(
        r"ServerBindingCursor|ModelState\(|cursor_factory|prepare_threshold *=|"
        r"synchronous_commit|__new__\(|from django\.db\.backends\.\w+\.base import"
    )
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in modules().values()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if forbidden.search(line)
    ]
    assert found == []


@pytest.mark.parametrize(
    "module", sorted(n for n in modules() if n not in {"django_durable.migrations"})
)
def test_each_module_imports_alone(module):
    """Imported first in a fresh interpreter (after django.setup()), every module loads:
    no import works only because another module happened to load first."""
    code = f"import django; django.setup(); import importlib; importlib.import_module({module!r})"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]


# The store's modules the rest of the package may import past ``store/__init__.py``
# (the face's docstring would say why): none.
PAST_THE_STORE_FACE: set[str] = set()


def test_nothing_imports_past_the_store_face_but_what_its_docstring_names():
    past = sorted(
        f"{name} -> {target}"
        for name, targets in graph().items()
        if unit(name) != "store"
        for target in targets
        if unit(target) == "store"
        and target != "django_durable.store"
        and target not in PAST_THE_STORE_FACE
    )
    assert past == []
    face = ast.get_docstring(ast.parse((PACKAGE / "store" / "__init__.py").read_text()))
    for allowed in PAST_THE_STORE_FACE:
        assert f"``{allowed.removeprefix('django_durable.')}``" in face


# The store writes, operations decide: no ORM write, row lock or cursor in operations/.
# A call of one of these names is a write (``.update`` only on a query set: a dict's
# ``update`` is not); the allow-list names what remains, with why (today: nothing).
WRITES = {"create", "save", "delete", "bulk_create", "bulk_update", "get_or_create"}
WRITES |= {"update_or_create", "select_for_update", "cursor", "execute", "executemany", "raw"}
OPERATIONS_MAY_WRITE: dict[str, str] = {}


def writes_in(source: str) -> list[str]:
    """``line: call`` for each ORM write, row lock or cursor in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, receiver = node.func.attr, ast.unparse(node.func.value)
        on_query_set = ".objects" in receiver or re.search(r"\.(filter|exclude|all)\(", receiver)
        if name in WRITES or (name == "update" and on_query_set):
            found.append((node.lineno, f"{node.lineno}: {receiver}.{name}("))
    return [text for _line, text in sorted(found)]


def test_operations_write_nothing_themselves():
    found = [
        f"{name}:{line}"
        for name, path in modules().items()
        if unit(name) == "operations"
        for line in writes_in(path.read_text())
    ]
    assert [f for f in found if f.split(":")[0] not in OPERATIONS_MAY_WRITE] == []


def test_the_write_check_sees_every_kind_of_write():
    source = (
        "Schedule.objects.filter(name=n).update(enabled=False)\n"
        "Run.objects.create(id=1)\n"
        "sched.save(update_fields=['x'])\n"
        "Activity.objects.bulk_create(rows)\n"
        "Schedule.objects.select_for_update().get(name=n)\n"
        "connection.cursor()\n"
        "changes.update(more)\n"  # a dict: not a write
    )
    assert [line.split(":")[0] for line in writes_in(source)] == ["1", "2", "3", "4", "5", "6"]

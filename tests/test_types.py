"""Types: what mypy (with django-stubs) and pyright make of the public API, and the
cheap import that lets ``INSTALLED_APPS`` name the package.

- tests/typing/good.py, a typed project's use of the whole API, passes both with no
  error (its ``assert_type`` calls pin the types they infer);
- every line of tests/typing/bad.py marked ``# expect-error`` is reported by both (or
  by the one tool the mark names), and no other line is;
- importing ``django_durable`` before ``django.setup()`` loads no models module, and
  the names type checkers see (``TYPE_CHECKING``) are the ones loaded on first use.
"""

import ast
import json
import os
import pathlib
import re
import subprocess
import sys
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "tests" / "typing"
TOOLS = ("mypy", "pyright")
MARK = re.compile(r"#\s*expect-error(?::\s*(?P<tool>\w+))?\s*$")
MYPY_LINE = re.compile(r"^(?P<path>[^:\s]+\.py):(?P<line>\d+):(?:\d+:)? (?P<severity>\w+): ")


def expected_errors(path: pathlib.Path) -> dict[str, set[int]]:
    """The lines of ``path`` marked ``# expect-error`` (for both tools) or
    ``# expect-error: TOOL`` (for that one), per tool."""
    expected: dict[str, set[int]] = {tool: set() for tool in TOOLS}
    with path.open("rb") as source:
        for token in tokenize.tokenize(source.readline):
            if token.type == tokenize.COMMENT and (found := MARK.search(token.string)):
                tool = found["tool"]
                assert tool in (None, *TOOLS), f"line {token.start[0]}: unknown tool {tool!r}"
                for name in TOOLS if tool is None else (tool,):
                    expected[name].add(token.start[0])
    return expected


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict[str, set[int]]]:
    """Both tools run once, side by side, on both samples: per tool, per sample file
    name, the lines reported as errors."""
    cache = tmp_path_factory.mktemp("mypy-cache")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    mypy = subprocess.Popen(
        [sys.executable, "-m", "mypy", "--config-file", str(SAMPLES / "mypy.ini"),
         "--cache-dir", str(cache), "tests/typing/good.py", "tests/typing/bad.py"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    pyright = subprocess.Popen(
        [sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable,
         "-p", "pyrightconfig.json"],
        cwd=SAMPLES, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    mypy_out, mypy_err = mypy.communicate(timeout=300)
    pyright_out, pyright_err = pyright.communicate(timeout=300)

    found: dict[str, dict[str, set[int]]] = {tool: {} for tool in TOOLS}
    assert mypy.returncode in (0, 1), mypy_out + mypy_err
    for line in mypy_out.splitlines():
        if (hit := MYPY_LINE.match(line)) and hit["severity"] == "error":
            path = hit["path"]
            name = pathlib.Path(path).name if path.startswith("tests/typing/") else path
            found["mypy"].setdefault(name, set()).add(int(hit["line"]))
    assert pyright.returncode in (0, 1), pyright_out[-2000:] + pyright_err[-2000:]
    result = json.loads(pyright_out)
    assert result["summary"]["filesAnalyzed"] == 2, result["summary"]
    for diagnostic in result["generalDiagnostics"]:
        if diagnostic["severity"] == "error":
            name = pathlib.Path(diagnostic["file"]).name
            found["pyright"].setdefault(name, set()).add(diagnostic["range"]["start"]["line"] + 1)
    return found


@pytest.mark.parametrize("tool", TOOLS)
def test_the_typed_usage_sample_has_no_error(reports, tool):
    assert reports[tool].get("good.py", set()) == set()
    assert set(reports[tool]) <= {"good.py", "bad.py"}, reports[tool]  # nothing elsewhere


@pytest.mark.parametrize("tool", TOOLS)
def test_every_wrong_call_is_reported_and_nothing_else(reports, tool):
    expected = expected_errors(SAMPLES / "bad.py")[tool]
    assert len(expected) > 40
    reported = reports[tool].get("bad.py", set())
    assert sorted(expected - reported) == [], "marked but not reported"
    assert sorted(reported - expected) == [], "reported but not marked"


def run_python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter with the suite's settings module set but
    ``django.setup()`` not called; it prints one JSON value."""
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_importing_the_package_before_the_apps_are_ready_loads_no_model():
    """What ``INSTALLED_APPS`` does: import the package while the app registry is
    still empty. Only the exceptions, the workflow definitions and durations load;
    the operations, the store and the models wait for first use."""
    loaded = run_python(
        "import json, sys\n"
        "from django.apps import apps\n"
        "import django_durable\n"
        "from django_durable import Workflow, step, seconds, KeyTaken\n"
        "print(json.dumps({'ready': apps.ready, 'modules': sorted(sys.modules)}))\n"
    )
    assert loaded["ready"] is False
    ours = [m for m in loaded["modules"] if m.startswith("django_durable")]
    assert "django_durable.models" not in ours
    assert not [m for m in ours if m.endswith(".models") or ".store" in m], ours
    assert not [m for m in ours if m.startswith("django_durable.operations")], ours
    assert not [m for m in loaded["modules"] if m.endswith(".models")], "a models module loaded"
    assert "django.db.models" not in loaded["modules"]


def test_every_public_name_loads_once_the_apps_are_ready():
    names = run_python(
        "import json, django\n"
        "django.setup()\n"
        "import django_durable\n"
        "namespace = {}\n"
        "exec('from django_durable import *', namespace)\n"
        "missing = [n for n in django_durable.__all__ if n not in namespace]\n"
        "print(json.dumps({'missing': missing, 'all': django_durable.__all__,\n"
        "                  'dir': dir(django_durable),\n"
        "                  'start': django_durable.start.__module__}))\n"
    )
    assert names["missing"] == []
    assert set(names["all"]) <= set(names["dir"])
    assert names["start"] == "django_durable.operations.start"


def test_the_names_type_checkers_see_are_the_names_loaded_at_run_time():
    """``__init__.py`` names each lazy operation twice: in its ``TYPE_CHECKING`` block
    (what mypy and pyright read) and in ``_LAZY`` (what ``__getattr__`` loads); the two
    must agree name for name and module for module, and ``__all__`` lists them all."""
    tree = ast.parse((ROOT / "django_durable" / "__init__.py").read_text())
    typed: dict[str, str] = {}
    eager: set[str] = set()
    lazy: dict[str, str] = {}
    exported: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for inner in node.body:
                assert isinstance(inner, ast.ImportFrom)
                typed.update({alias.name: inner.module for alias in inner.names})
        elif isinstance(node, ast.ImportFrom) and node.module.startswith("django_durable"):
            eager.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_LAZY":
            lazy = eval(compile(ast.Expression(node.value), "_LAZY", "eval"))  # literals only
        elif isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__":
            exported = ast.literal_eval(node.value)
    assert typed and lazy
    assert typed == lazy
    assert sorted(exported) == sorted(eager | set(typed))
    assert len(exported) == len(set(exported))

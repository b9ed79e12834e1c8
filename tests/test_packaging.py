"""What ``make dist`` builds: the sdist, and the wheel built from it, with the license,
the typing marker, every template and static file and the metadata that package
indexes show; twine's check passes (metadata, README rendering) and
``scripts/check-dist.py`` finds nothing amiss (no tests, bench or example project).

They are built as ``make dist`` builds them (``python -m build --no-isolation``, with
the setuptools, build and twine the ``test`` extra installs), offline, from a copy of
the work tree, so no build leaves files in it and a stale ``build/`` there can't hide a
missing file. Building both takes about 10 s.
"""

import email
import importlib.util
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_durable"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
WHEEL = f"django_durable_workflows-{PROJECT['version']}-py3-none-any.whl"
# What a work tree holds that is no source: left out of the copy built from.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv*", "__pycache__", "*.egg-info", "build", "dist", ".demo", "*.sqlite3*",
    ".pytest_cache", ".ruff_cache", ".hypothesis", "node_modules",
)  # fmt: skip


def tool(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=240
    )


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> pathlib.Path:
    for module in ("build", "twine"):
        assert importlib.util.find_spec(module), f"the test extra installs {module}"
    source = tmp_path_factory.mktemp("source") / "tree"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    out = tmp_path_factory.mktemp("dist")
    built = tool("-m", "build", "--no-isolation", "--outdir", str(out), ".", cwd=source)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def wheel(dist) -> zipfile.ZipFile:
    with zipfile.ZipFile(dist / WHEEL) as archive:
        yield archive


def test_twine_and_check_dist_pass_on_what_make_dist_builds(dist):
    """``make dist``'s checks: the metadata and the README render for a package index,
    and each archive holds what it should (the sdist built the wheel, so it holds all
    a build needs)."""
    checked = tool("-m", "twine", "check", "--strict", *map(str, sorted(dist.iterdir())))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2, checked.stdout
    contents = tool("scripts/check-dist.py", str(dist))
    assert contents.returncode == 0, contents.stderr
    makefile = (ROOT / "Makefile").read_text()
    assert "twine check --strict dist/*" in makefile and "scripts/check-dist.py dist" in makefile


def test_check_dist_names_what_has_no_place_in_the_archives(dist, tmp_path):
    """The check is no formality: a test file in the sdist and a file of the tests in
    the wheel are named, as is a template missing from the wheel."""
    sdist = next(dist.glob("*.tar.gz"))
    shutil.copy(sdist, tmp_path / sdist.name)
    with zipfile.ZipFile(dist / WHEEL) as good, zipfile.ZipFile(tmp_path / WHEEL, "w") as bad:
        for item in good.infolist():
            if not item.filename.endswith("_key_view.html"):
                bad.writestr(item, good.read(item))
        bad.writestr("tests/test_smoke.py", "")
    found = tool("scripts/check-dist.py", str(tmp_path))
    assert found.returncode == 1
    assert "wheel: tests/test_smoke.py is not the package's" in found.stderr
    assert "wheel: django_durable/templates/django_durable/_key_view.html is missing" in (
        found.stderr
    )


def test_the_install_lines_name_the_wheel_make_dist_builds():
    """Until the package is on the index, the README and the quickstart say how to
    install from a checkout or from the wheel ``make dist`` builds, by its name."""
    for page in (ROOT / "README.md", ROOT / "docs" / "quickstart.md"):
        text = page.read_text()
        assert f'pip install "dist/{WHEEL}[postgres]"' in text, page.name
        assert 'pip install -e "path/to/checkout[postgres]"' in text, page.name
        assert "make dist" in text, page.name


def shipped(folder: str) -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in (PACKAGE / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_the_wheel_holds_the_license_and_the_typing_marker(wheel):
    names = set(wheel.namelist())
    [licence] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    text = wheel.read(licence).decode()
    assert text.startswith("MIT License")
    assert "Copyright (c) 2026 The django-durable authors" in text
    assert "django_durable/py.typed" in names


def test_the_wheel_holds_every_template_and_static_file(wheel):
    names = set(wheel.namelist())
    templates, static = shipped("templates"), shipped("static")
    assert templates and static
    assert templates - names == set()
    assert static - names == set()
    assert "django_durable/migrations/0001_initial.py" in names
    # The functions' text, which the migrations read by file name.
    assert shipped("migrations/sql") and shipped("migrations/sql") - names == set()
    assert not [n for n in names if n.startswith(("tests/", "bench/", "example_project/"))]


def test_the_wheel_metadata(wheel):
    [name] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    meta = email.message_from_bytes(wheel.read(name))
    # The name on the package index: django-durable is an unrelated project's.
    assert meta["Name"] == "django-durable-workflows"
    assert (
        meta["Version"]
        == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    )
    assert meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    classifiers = set(meta.get_all("Classifier"))
    assert {
        "Framework :: Django :: 5.2",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.13",
        "Typing :: Typed",
    } <= classifiers
    requires = meta.get_all("Requires-Dist")
    assert any(r.replace(" ", "") in ("Django<6.1,>=5.2", "django<6.1,>=5.2") for r in requires)
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert set(urls) == {"Documentation", "Source", "Changelog", "Issues"}
    home = "https://github.com/django-durable/django-durable"
    assert all(u.startswith(home) for u in urls.values())
    assert set(meta.get_all("Provides-Extra")) >= {"postgres", "tasks", "otel"}


def test_the_readme_on_a_package_page_links_and_shows_images_absolutely(wheel):
    """The package index renders the README without the repository around it: every
    link and image is absolute, into the repository pyproject names."""
    [name] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    readme = email.message_from_bytes(wheel.read(name)).get_payload()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert targets
    relative = [t for t in targets if not t.startswith("https://")]
    assert relative == []
    repository = (
        "https://github.com/django-durable/django-durable/blob/main/",
        "https://raw.githubusercontent.com/django-durable/django-durable/main/",
    )
    for target in targets:
        assert target.startswith(repository), target
        path = target.split("/main/", 1)[1]
        assert (ROOT / path).exists(), target
    assert 'pip install "django-durable-workflows[postgres]"' in readme
    assert "django-durable[" not in readme


def test_every_install_line_names_the_distribution():
    """No page tells a user to install the other project's ``django-durable``."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for line in page.read_text().splitlines():
            if "pip install" in line and "-e " not in line and '-e "' not in line:
                names = ("django-durable-workflows", "pytest", f"dist/{WHEEL}")
                assert any(name in line for name in names), (page.name, line)
                assert not re.search(r"django-durable(?!-workflows)[\[ \"']", line), line

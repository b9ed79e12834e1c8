"""The wheel that ``pip wheel .`` builds: the license, the typing marker, every template
and static file, and the metadata that package indexes show.

The wheel is built offline from a copy of the sources (``--no-build-isolation``, with
the setuptools the ``test`` extra installs), so no build leaves files in the work tree
and a stale ``build/`` there can't hide a missing file.
"""

import email
import pathlib
import re
import tomllib
import zipfile

import pytest

from tests.quickstart_project import build_wheel

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_durable"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    built = build_wheel(tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist"))
    with zipfile.ZipFile(built) as archive:
        yield archive


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
                assert "django-durable-workflows" in line or "pytest" in line, (page.name, line)
                assert not re.search(r"django-durable(?!-workflows)[\[ \"']", line), line

"""The wheel that ``pip wheel .`` builds: the license, the typing marker, every template
and static file, and the metadata that package indexes show.

The wheel is built offline from a copy of the sources (``--no-build-isolation``, with
the setuptools the ``test`` extra installs), so no build leaves files in the work tree
and a stale ``build/`` there can't hide a missing file.
"""

import email
import importlib.metadata
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_durable"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    major = int(importlib.metadata.version("setuptools").split(".")[0])
    assert major >= 77, "the test extra installs setuptools>=77: pip install -e '.[test]'"
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        PACKAGE, source / "django_durable", ignore=shutil.ignore_patterns("__pycache__")
    )
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    [built] = out.glob("django_durable-*.whl")
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
    assert not [n for n in names if n.startswith(("tests/", "bench/", "example_project/"))]


def test_the_wheel_metadata(wheel):
    [name] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    meta = email.message_from_bytes(wheel.read(name))
    assert meta["Version"] == "0.2.0"
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
    assert set(urls) == {"Documentation", "Source", "Changelog"}
    home = "https://github.com/django-durable/django-durable"
    assert all(u.startswith(home) for u in urls.values())

"""docs/quickstart.md, run as a new user runs it: from an empty directory, with the
built wheel installed into a fresh virtualenv, the page's own blocks and commands
(tests/quickstart_project.py reads them), on the database the suite runs on.

The virtualenv gets the packages the page installs besides django-durable (Django,
psycopg, pytest-django...) from this interpreter's site-packages through a ``.pth``
file, so that no network is needed; django-durable itself is the wheel, installed into
the virtualenv, and the project never sees this checkout.
"""

import json
import os
import site
import sys
from pathlib import Path

import pytest
from django.db import connection

from tests import quickstart_project as quickstart

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh virtualenv with the wheel installed, and the page's ``pip install`` line
    satisfied offline."""
    wheel = quickstart.build_wheel(
        tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    )
    path = tmp_path_factory.mktemp("venv")
    env = clean_environment()
    quickstart.run([sys.executable, "-m", "venv", "--without-pip", str(path)], path, env)
    python = str(path / "bin" / "python")
    purelib = quickstart.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], path, env
    ).stdout.strip()
    # This interpreter's packages, after the virtualenv's own (a .pth line is appended
    # to sys.path, and the .pth files of that directory, an editable install of this
    # checkout among them, are not read).
    theirs = [p for p in site.getsitepackages() if Path(p).is_dir()]
    assert theirs and str(quickstart.ROOT) not in theirs
    (Path(purelib) / "outside.pth").write_text("\n".join(theirs) + "\n")
    pip = [python, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    quickstart.run(
        [*pip, "install", "-q", "--no-index", "--no-deps", "--force-reinstall", str(wheel)],
        path,
        env,
    )
    # The page's own install line, offline: the wheel's name, its extra and the rest
    # must all be satisfied (the wheel by the one just installed).
    [line] = [words for words in quickstart.commands() if words[:2] == ["pip", "install"]]
    assert "django-durable-workflows[postgres]" in line, line
    quickstart.run(
        [*pip, "install", "-q", "--no-index", "--find-links", str(wheel.parent), *line[2:]],
        path,
        env,
    )
    return path


def clean_environment() -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for name in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "PYTEST_ADDOPTS", "DATABASE_URL"):
        env.pop(name, None)
    return env


def postgres_database(name: str) -> dict[str, str]:
    """A database of its own for the project, made the way the page's ``createdb
    mysite`` makes it; the page's connection settings swapped for this suite's."""
    import psycopg

    settings = connection.settings_dict
    with psycopg.connect(
        dbname="postgres",
        user=settings["USER"],
        host=settings["HOST"],
        port=settings["PORT"],
        autocommit=True,
    ) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return {
        '"NAME": "mysite"': f'"NAME": "{name}"',
        '"USER": "postgres"': f'"USER": "{settings["USER"]}"',
        '"HOST": "127.0.0.1"': f'"HOST": "{settings["HOST"]}"',
        '"PORT": "5432"': f'"PORT": "{settings["PORT"]}"',
    }


def test_the_quickstart_runs_as_written(venv, tmp_path):
    python = str(venv / "bin" / "python")
    env = clean_environment()
    project = tmp_path / "mysite"
    project.mkdir()

    def manage(*args):
        return quickstart.run([python, "manage.py", *args], project, env)

    # The package is the wheel, in the virtualenv: not this checkout.
    where = quickstart.run(
        [python, "-c", "import django, django_durable; print(django_durable.__file__)"],
        project,
        env,
    ).stdout.strip()
    assert where.startswith(str(venv)), where

    database = "postgres" if connection.vendor == "postgresql" else "sqlite"
    replace = None
    if database == "postgres":
        name = os.environ.get("DURABLE_TEST_DB_NAME", "test_django_durable") + "_quickstart"
        replace = postgres_database(name)

    # Every block of the page, in order: each command runs when the page gives it,
    # with the files written so far. The worker runs in --burst after a start from
    # the view, the interactive ones are left out.
    ran = []
    for block in quickstart.blocks():
        if block.action != "run":
            quickstart.write_block(project, block, database, replace)
            continue
        for words in quickstart.split(block):
            if words[:2] in (["python", "-m"], [".", ".venv/bin/activate"], ["pip", "install"]):
                continue  # the virtualenv and the install: the fixture's
            if quickstart.start_command(python, project, env, words):
                continue
            assert words[:2] == ["python", "manage.py"] or words == ["pytest"], words
            ran.append(words)
            if words[2:] in (["durable_worker"], ["runserver"], ["createsuperuser"]) or words == [
                "pytest"
            ]:
                continue
            out = manage(*words[2:]).stdout
            if words[2:] == ["check"]:
                assert "System check identified no issues" in out, out
    assert [w[2] for w in ran if w[0] == "python"] == [
        "check",
        "makemigrations",
        "migrate",
        "durable_worker",
        "shell",
        "createsuperuser",
        "runserver",
    ]
    pk = int(out.strip().splitlines()[-1])  # the shell line prints the article's id

    # No warning of django-durable's on the page's settings.
    assert "django_durable" not in manage("check").stderr

    # Publish twice from the view (a double click): one run, and the redirect to its
    # page in the dashboard.
    answer = manage(
        "shell",
        "-c",
        "import json\n"
        "from django.test import Client\n"
        "client = Client(HTTP_HOST='127.0.0.1')\n"
        f"first = client.post('/articles/{pk}/publish/')\n"
        f"second = client.post('/articles/{pk}/publish/')\n"
        f"page = client.get('/articles/{pk}/publish/')\n"
        "print(json.dumps([first.status_code, first.url, second.url, page.status_code,\n"
        "                  'csrfmiddlewaretoken' in page.content.decode()]))",
    ).stdout
    first, url, again, page, has_form = json.loads(answer.strip().splitlines()[-1])
    assert (first, page, has_form) == (302, 200, True)
    assert url == again and url.startswith("/admin/durable/runs/"), (url, again)

    # The worker of step 8, until nothing is due.
    manage("durable_worker", "--burst")
    state = manage(
        "shell",
        "-c",
        "import json, django_durable as durable\n"
        "from articles.models import Article\n"
        f"runs = list(durable.list_executions(key='article:{pk}'))\n"
        f"article = Article.objects.get(pk={pk})\n"
        "print(json.dumps([[str(r.id), r.status] for r in runs]\n"
        "                 + [article.published, article.summary, durable.__file__]))",
    ).stdout
    [[run_id, status], published, summary, imported] = json.loads(state.strip().splitlines()[-1])
    assert status == "completed" and url == f"/admin/durable/runs/{run_id}/"
    assert published and summary == "Durable workflows for Django."
    assert imported.startswith(str(venv))

    # The page's own test, with the page's pytest.ini.
    result = quickstart.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], project, env)
    assert "1 passed" in result.stdout, result.stdout

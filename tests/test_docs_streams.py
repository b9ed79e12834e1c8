"""docs/streams.md's live page, built as a reader builds it: a new project made from
the page's own blocks (tests/quickstart_project.py reads them), on the database the
suite runs on, with this checkout's django_durable. A signed-in user starts a summary,
a worker writes it, and the page's views answer: the page has the htmx SSE wiring,
the stream view sends each word as an event and ends with ``close`` (WSGI, Django's
test client), the part shows the progress bar and the text escaped, and another user
gets 404 from every view of it."""

import json
import os
import sys

import pytest
from django.db import connection

from tests import quickstart_project as project
from tests.test_quickstart import postgres_database

pytestmark = [pytest.mark.slow]

PAGE = project.ROOT / "docs" / "streams.md"
DOCUMENT = "Durable <b>streams</b> for Django, written word by word."

CHECK = """
import json
from django.contrib.auth.models import User
from django.test import Client

alice = User.objects.create_user("alice", password="pw")
mallory = User.objects.create_user("mallory", password="pw")
client = Client(HTTP_HOST="127.0.0.1")
client.force_login(alice)
started = client.post("/summaries/start/", {"document": DOCUMENT})
page = client.get(started.url)
print(json.dumps({"started": [started.status_code, started.url],
                  "page": [page.status_code, page.content.decode()]}))
"""

READ = """
import json
from django.contrib.auth.models import User
from django.test import Client

answers = {}
for name in ("alice", "mallory"):
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(User.objects.get(username=name))
    stream = client.get(URL + "stream/")
    body = b"".join(stream.streaming_content).decode() if stream.status_code == 200 else ""
    part = client.get(URL + "part/")
    answers[name] = {
        "page": client.get(URL).status_code,
        "stream": [stream.status_code, stream.get("Content-Type"), body],
        "part": [part.status_code, part.content.decode()],
    }
print(json.dumps(answers))
"""


def events(body: str) -> list[dict]:
    found = []
    for block in body.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
        )
        if fields:
            found.append(fields)
    return found


def test_the_streams_page_builds_a_live_page_that_works(tmp_path):
    python = sys.executable
    env = {**os.environ, "PYTHONPATH": str(project.ROOT), "PYTHONUNBUFFERED": "1"}
    for name in ("DJANGO_SETTINGS_MODULE", "PYTEST_ADDOPTS", "DATABASE_URL"):
        env.pop(name, None)
    mysite = tmp_path / "mysite"
    mysite.mkdir()
    database = "postgres" if connection.vendor == "postgresql" else "sqlite"
    replace = None
    if database == "postgres":
        name = os.environ.get("DURABLE_TEST_DB_NAME", "test_django_durable") + "_streams"
        replace = postgres_database(name)
    project.start_project(python, mysite, env, page=PAGE)
    project.write_files(mysite, database, replace, page=PAGE)

    def manage(*args):
        return project.run([python, "manage.py", *args], mysite, env)

    ran = []
    for words in project.commands(PAGE):
        if words[0] == "django-admin" or words[:3] == ["python", "manage.py", "startapp"]:
            continue  # project.start_project
        assert words[:2] == ["python", "manage.py"], words
        ran.append(words[2])
        if words[2] != "durable_worker":  # after the start, in --burst
            manage(*words[2:])
    assert ran == ["makemigrations", "migrate", "durable_worker"]
    assert "django_durable" not in manage("check").stderr

    out = manage("shell", "-c", f"DOCUMENT = {DOCUMENT!r}\n" + CHECK).stdout
    answer = json.loads(out.strip().splitlines()[-1])
    status, url = answer["started"]
    assert status == 302 and url.startswith("/summaries/"), answer["started"]
    status, html = answer["page"]
    assert status == 200
    # The page's wiring for htmx's SSE extension (the scripts come from a CDN this
    # machine can't reach: the events are checked below with an HTTP client).
    assert 'hx-ext="sse"' in html and f'sse-connect="{url}stream/"' in html
    assert 'sse-close="close"' in html
    assert f'hx-get="{url}part/"' in html and "sse:value" in html

    manage("durable_worker", "--burst")
    out = manage("shell", "-c", f"URL = {url!r}\n" + READ).stdout
    answers = json.loads(out.strip().splitlines()[-1])

    alice = answers["alice"]
    status, kind, body = alice["stream"]
    assert (alice["page"], status, kind) == (200, 200, "text/event-stream")
    got = events(body)
    words = [w + " " for w in DOCUMENT.split()]
    values = [e for e in got if e.get("event") == "value"]
    assert [json.loads(e["data"]) for e in values] == words
    assert [int(e["id"]) for e in values] == list(range(len(words)))
    assert got[-1] == {"event": "close", "data": ""}
    status, part = alice["part"]
    assert status == 200
    assert f'<progress value="{len(words)}" max="{len(words)}">' in part
    assert "writing the summary" in part
    assert "Durable &lt;b&gt;streams&lt;/b&gt; for Django" in part and "<b>" not in part

    # Another user: the owner check of every view answers 404, never the text.
    mallory = answers["mallory"]
    assert (mallory["page"], mallory["stream"][0], mallory["part"][0]) == (404, 404, 404)
    assert "streams" not in mallory["part"][1]

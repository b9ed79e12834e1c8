import pytest

import django_durable as durable
from django_durable.models import Run
from django_durable.testing import drain
from tests.testapp.workflows import ProcessArticle


@pytest.mark.django_db
def test_start_and_drain():
    run_id = durable.start(ProcessArticle, {"id": 42}, key="article:42")
    assert durable.start(ProcessArticle, {"id": 42}, key="article:42") == run_id
    assert drain() == 2
    run = Run.objects.get(id=run_id)
    assert run.status == "completed", run.error
    assert run.result == {"summary": "body of 42"}

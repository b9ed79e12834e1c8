"""The runs search syntax and the input diff, without a database."""

import uuid

from django_durable.dashboard import search
from django_durable.dashboard.keyview import input_diff


def test_key_takes_everything_after_the_first_colon():
    parsed = search.parse("key:article:42")
    assert parsed.filters == {"key": "article:42"} and parsed.text == [] and not parsed.errors


def test_filters_combine_with_free_text_and_quotes():
    parsed = search.parse('workflow:send_invoice status:failed key:"order 7" late  fees')
    assert parsed.filters == {"workflow": "send_invoice", "status": "failed", "key": "order 7"}
    assert parsed.text == ["late", "fees"]


def test_an_unknown_prefix_is_text_and_an_unknown_status_is_an_error():
    parsed = search.parse("article:42 status:nonsense")
    assert parsed.text == ["article:42"]
    assert parsed.filters == {}
    assert parsed.errors and "unknown status 'nonsense'" in parsed.errors[0]


def test_empty_and_odd_input():
    assert search.parse("").filters == {} and search.parse(None).text == []
    assert search.parse('key:"unclosed').filters == {"key": "unclosed"}
    assert search.parse("key:").filters == {}


def test_a_run_id_is_matched_exactly():
    run_id = uuid.uuid4()
    condition = search._text_filter(str(run_id))
    assert condition.children == [("id", run_id)]


def test_input_diff_marks_kept_and_dropped_lines():
    diff = input_diff({"id": 1, "title": "a"}, {"id": 1, "title": "<b>"})
    kinds = {(line.kind, line.text) for line in diff}
    assert ("remove", '-  "title": "a"') in kinds
    assert ("add", '+  "title": "<b>"') in kinds  # text, escaped by the template
    assert diff[0].kind == "header" and diff[2].kind == "hunk"
    assert input_diff({"a": 1}, {"a": 1}) == []

"""A view that returns a run's stream as Server-Sent Events, as a project's would (the
tests serve it with uvicorn; a project's own view checks who may read first)."""

import django_durable as durable


def stream(request, run_id, name):
    return durable.stream_response(request, run_id, name)


async def astream(request, run_id, name):
    return durable.stream_response(request, run_id, name)

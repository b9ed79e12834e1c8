"""The dashboard's URL patterns, served by one ``RunAdmin``'s admin site."""

from __future__ import annotations

import functools

from django.urls import path

from django_durable.dashboard import (
    actions,
    bulk,
    pending,
    queues,
    rerun,
    schedules,
    streams,
    values,
    views,
    workers,
)
from django_durable.dashboard.site import guard

APP_NAME = "django_durable"


def patterns(run_admin) -> list:
    """Every page (``view_run``) and action (``change_run``), named as in the API."""

    def see(view):
        return guard(view, run_admin)

    def act(view):
        return guard(view, run_admin, perm="change")

    bulk_view = functools.partial(bulk.bulk_action, matching_runs=views.matching_runs)
    functools.update_wrapper(bulk_view, bulk.bulk_action)
    return [
        path("", see(views.overview), name="overview"),
        path("keys/", see(views.keys), name="keys"),
        path("runs/", see(views.runs), name="runs"),
        path("runs/bulk/", act(bulk_view), name="bulk"),
        path("runs/<uuid:run_id>/", see(views.run), name="run"),
        path("runs/<uuid:run_id>/value/<str:field>/", see(values.download), name="value"),
        path("runs/<uuid:run_id>/stream/<str:name>/", see(streams.stream), name="stream"),
        path(
            "runs/<uuid:run_id>/rerun-from-step/",
            act(rerun.rerun_from_step),
            name="rerun_from_step",
        ),
        path(
            "runs/<uuid:run_id>/rerun-with-input/<int:activity_id>/",
            act(rerun.rerun_with_input),
            name="rerun_with_input",
        ),
        path("runs/<uuid:run_id>/<slug:action>/", act(actions.run_action), name="run_action"),
        path("workflows/<str:name>/", see(views.workflow), name="workflow"),
        path("inputs/", see(pending.inputs_page), name="inputs"),
        path("inputs/<uuid:run_id>/answer/", act(pending.answer), name="answer"),
        path("schedules/", see(schedules.schedules_page), name="schedules"),
        path(
            "schedules/<path:name>/<slug:action>/",
            act(schedules.schedule_action),
            name="schedule_action",
        ),
        path("workers/", see(workers.workers_page), name="workers"),
        path("queues/", see(queues.queues_page), name="queues"),
        path("queues/<path:name>/<slug:action>/", act(queues.queue_action), name="queue_action"),
    ]

"""factory-boy factories for the tables, for states the public API can't reach yet
(compensating, compensated...) and for bulk rows (EXPLAIN, pruning)."""

import uuid

import factory
from django.utils import timezone

from django_durable.models import (
    FINISHED_STATUSES,
    Activity,
    Event,
    Run,
    Status,
    StepAttempt,
)


class RunFactory(factory.django.DjangoModelFactory):
    """A run; ``holds_key`` defaults to True when the run has a key."""

    class Meta:
        model = Run

    id = factory.LazyFunction(uuid.uuid4)
    workflow = "sync_account"
    status = Status.PENDING
    input = factory.LazyFunction(dict)
    key = None
    holds_key = factory.LazyAttribute(lambda run: run.key is not None)
    created_at = factory.LazyFunction(timezone.now)
    due_at = factory.LazyAttribute(
        lambda run: run.created_at if run.status == Status.PENDING else None
    )
    started_at = factory.LazyAttribute(
        lambda run: None if run.status == Status.PENDING else run.created_at
    )
    finished_at = factory.LazyAttribute(
        lambda run: run.created_at if run.status in FINISHED_STATUSES else None
    )


class StepAttemptFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = StepAttempt

    run = factory.SubFactory(RunFactory)
    step = "sync"
    step_index = 0
    attempt = 1
    status = StepAttempt.Outcome.COMPLETED


class EventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Event

    run = factory.SubFactory(RunFactory)
    name = "article_updated"
    payload = factory.LazyFunction(dict)


class ActivityFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Activity

    kind = Activity.Kind.KEY_DUPLICATE
    run_id = factory.LazyFunction(uuid.uuid4)
    workflow = "sync_account"
    key = factory.Sequence(lambda n: f"key:{n}")
    details = factory.LazyAttribute(
        lambda a: {"key": a.key, "workflow": a.workflow, "outcome": "use_existing"}
    )
    created_at = factory.LazyFunction(timezone.now)

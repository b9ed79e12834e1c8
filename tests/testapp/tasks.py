"""Task functions for the Tasks backend tests (the same file on Django 5.2 and 6)."""

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

from django_durable.tasks import durable_task


@task
def add(x, y):
    return x + y


@task(queue_name="emails")
def send_email(to, subject="hello"):
    return {"to": to, "subject": subject}


@task
@durable_task(key=lambda article_id, **_: f"article:{article_id}", reuse="after_failure")
def process_article(article_id, note=""):
    return {"article": article_id, "note": note}


@task
@durable_task(key=lambda order_id: f"order:{order_id}", on_duplicate="error")
def charge(order_id):
    return order_id


@task
@durable_task(retries=2, backoff=0)
def explode():
    raise ValueError("the task failed")


@task(takes_context=True)
def attempt_number(context):
    return context.attempt


@task
async def async_double(x):
    return 2 * x


@task
@durable_task(flow_key=lambda tenant: f"tenant:{tenant}", concurrency_per_key=1)
def tenant_report(tenant):
    return tenant

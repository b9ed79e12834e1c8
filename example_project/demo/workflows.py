"""Workflows of the example project: one per key feature, doing pretend work.

Steps sleep a little so the dashboard shows runs while they run; inputs can
ask for a failure (``"fail": true``) to show retries, failed runs and retry.
"""

import random
import time

import django_durable as durable
from django_durable import Workflow, step


def work(seconds: float) -> None:
    """Pretend to call a slow service."""
    time.sleep(seconds * random.uniform(0.5, 1.5))


class ProcessArticle(Workflow):
    """Process each article once. A failed run may be replaced by a new start
    (``reuse="after_failure"``); a duplicate start gets the existing run and
    its (possibly newer) input is dropped: the Key view shows the diff."""

    name = "process_article"
    reuse = "after_failure"

    @step
    def fetch(self, ctx):
        work(0.5)
        ctx.put("body", f"The body of article {ctx.input['id']}: {ctx.input.get('title', '')}")

    @step(retries=2, backoff=durable.seconds(2))
    def summarize(self, ctx):
        work(1)
        if ctx.input.get("fail"):
            raise RuntimeError(f"the summariser rejected article {ctx.input['id']}")
        return {"summary": ctx.get("body")[:40]}


class SendInvoice(Workflow):
    """An invoice is sent once, ever (``reuse="never"``); sending it again is an
    error the caller sees (``on_duplicate="error"`` raises ``KeyTaken``)."""

    name = "send_invoice"
    reuse = "never"
    on_duplicate = "error"

    @step
    def render_pdf(self, ctx):
        work(0.5)
        ctx.put("pdf", f"invoice-{ctx.input['number']}.pdf")

    @step(retries=3, backoff=durable.seconds(1))
    def email(self, ctx):
        work(0.5)
        return {"sent": ctx.input["number"], "to": ctx.input.get("email", "billing@example.com")}


class SyncAccount(Workflow):
    """One sync per account at a time; a change during a sync leaves one more
    sync waiting behind it, with the newest input (``on_duplicate="run_again"``)."""

    name = "sync_account"
    on_duplicate = "run_again"

    @step
    def pull(self, ctx):
        work(2)
        ctx.put("changes", random.randint(0, 20))

    @step
    def push(self, ctx):
        work(1)
        return {"account": ctx.input["account"], "changes": ctx.get("changes")}


class IndexArticle(Workflow):
    """Re-index an article after edits settle: a burst of saves becomes one run
    with the last input, at most a minute after the first save."""

    name = "index_article"
    debounce = durable.Debounce(period=durable.seconds(5), timeout=durable.minutes(1))

    @step
    def index(self, ctx):
        work(0.5)
        return {"indexed": ctx.input["id"], "revision": ctx.input.get("revision")}


class Cleanup(Workflow):
    """Every five minutes, with a key: a fire while the last cleanup still runs
    starts nothing (and is recorded as a re-add)."""

    name = "cleanup"
    schedules = [durable.Cron("*/5 * * * *", key="cleanup")]

    @step
    def delete_expired_sessions(self, ctx):
        work(3)
        return {"deleted": random.randint(0, 50)}


SUMMARY = (
    "Durable workflows keep each step's result in the database, so a run survives "
    "a deploy, a crash and a retry, and its progress shows while it runs."
)


class SummarizeDocument(Workflow):
    """Writes a summary word by word, the way a language model streams its answer:
    each word is an item of the stream ``text`` and the progress moves with it. The
    run's dashboard page shows the bar and the latest words while it runs."""

    name = "summarize_document"

    @step
    def summarize(self, ctx):
        out = ctx.stream("text")
        words = SUMMARY.split()
        for i, word in enumerate(words):
            time.sleep(ctx.input.get("pace", 0.3) * random.uniform(0.5, 1.5))
            out.write(word + " ")
            ctx.progress(i + 1, len(words), f"summarising document {ctx.input['document']}")
        out.close()
        return {"words": len(words)}

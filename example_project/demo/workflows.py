"""Workflows of the example project."""

import django_durable as durable
from django_durable import Workflow, step


class ProcessArticle(Workflow):
    """Process each article once; a failed attempt may be tried again."""

    name = "process_article"
    reuse = "after_failure"

    @step
    def fetch(self, ctx):
        ctx.put("body", f"The body of article {ctx.input['id']}.")

    @step(retries=2, backoff=durable.seconds(1))
    def summarize(self, ctx):
        return {"summary": ctx.get("body")[:24]}


class SendInvoice(Workflow):
    """Each invoice is sent once, ever; a duplicate is an error the producer sees."""

    name = "send_invoice"
    reuse = "never"
    on_duplicate = "error"

    @step
    def send(self, ctx):
        return {"sent": ctx.input["number"]}

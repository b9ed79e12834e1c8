"""A workflow that streams while it runs, for the dashboard's tests: it writes tokens
and progress, waits for an input (the run stays active), writes more, waits again."""

from django_durable import Workflow, step

HOSTILE = "<script>alert(1)</script>"


class DashStreams(Workflow):
    name = "dash_streams"

    @step
    def generate(self, ctx):
        out = ctx.stream("text")
        for token in ctx.input.get("tokens", []):
            out.write(token)
        for name in ctx.input.get("others", []):
            ctx.stream(name).write({"from": name})
        ctx.progress(2, ctx.input.get("total"), "writing the first part")

    @step
    def first_pause(self, ctx):
        return ctx.wait_for_input("more")

    @step
    def more(self, ctx):
        ctx.stream("text").write("the second part")
        ctx.progress(3, ctx.input.get("total"), "writing the second part")

    @step
    def second_pause(self, ctx):
        return ctx.wait_for_input("done")

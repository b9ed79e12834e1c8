from django.db import models


class SideEffect(models.Model):
    """A step's visible effect; the unique constraint proves a step ran once."""

    run_id = models.UUIDField()
    step = models.CharField(max_length=100)
    note = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run_id", "step"], name="testapp_effect_once")
        ]

    def __str__(self):
        return f"{self.step} of {self.run_id}"


class Execution(models.Model):
    """One execution of a step's body; repeats are allowed (and counted)."""

    run_id = models.UUIDField(db_index=True)
    step = models.CharField(max_length=100)
    pid = models.IntegerField(null=True)

    def __str__(self):
        return f"{self.step} of {self.run_id}"


class FlowSpan(models.Model):
    """When a flow-limited step began and ended, recorded by the step itself (this
    machine's clock, shared by the test's worker processes)."""

    run_id = models.UUIDField(db_index=True)
    workflow = models.CharField(max_length=200)
    flow_key = models.CharField(max_length=255, null=True)
    began = models.FloatField()
    ended = models.FloatField(null=True)

    def __str__(self):
        return f"{self.flow_key} {self.began}-{self.ended}"

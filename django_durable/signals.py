"""Signals sent by django-durable. All are sent after the transaction that
caused them commits, so a receiver never sees work that was rolled back.

- ``run_started(sender=WorkflowClass, run_id, workflow, key)``: a run was created.
- ``run_finished(sender=WorkflowClass, run_id, workflow, key, status)``: a run finished.
- ``key_duplicate(sender=WorkflowClass, run_id, workflow, key, outcome,
  input_changed, input)``: a start found its key taken; ``run_id`` is the run
  that answered it.
- ``key_handoff(sender=WorkflowClass, from_run_id, to_run_id, workflow, key)``:
  a new run took the key from a finished or replaced run.
- ``key_release(sender=WorkflowClass, run_id, workflow, key, by)``: a finished
  run's key was released.
- ``attempt_recorded(sender=StepAttempt, attempt)``: an attempt of a step or a
  compensation was recorded (completed, failed, suspended, cancelled or lost).
  The store writes attempts with the run's update in one statement, not with
  ``save()``: listen to this, not to ``post_save`` of ``StepAttempt``.
"""

from django.dispatch import Signal

run_started = Signal()
run_finished = Signal()
key_duplicate = Signal()
key_handoff = Signal()
key_release = Signal()
attempt_recorded = Signal()

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
"""

from django.dispatch import Signal

run_started = Signal()
run_finished = Signal()
key_duplicate = Signal()
key_handoff = Signal()
key_release = Signal()

"""The one package that talks SQL: inserts that respect keys, row locks, claims,
fenced writes of step results, recovery and pruning.

Everything here is a short statement or a short transaction. No row lock is
held while user code runs: a claim commits before the first step starts, and
every later write of the claiming worker is fenced (``fence`` must still be the
value the claim set, and the run must still be running).

Each module keeps its statements as named constants with a comment on what they
do and which index serves them. This face is the whole face: the rest of the package
imports names from here, never from a module of the store (tests/test_architecture.py
checks it). The store calls nothing above it: what it needs of the workflows'
declarations (a claim's flow limits) its caller passes. (Tests may reach into the
modules.)

Lock order: where one transaction locks both a key's holder and the run waiting
behind it, it locks the holder first (``get_holder(lock=True)``, then
``get_waiting_behind(lock=True)``), in every path: a finish handing the key on
(``finish.promote_waiting``), a ``run_again`` start, a ``cancel_existing`` start,
a ``cancel()`` of the waiting run (it locks the holder before cancelling it).
A transaction that also locks a parent locks it after both. Two transactions that
lock runs of two keys still can meet in a deadlock PostgreSQL breaks by aborting
one (sqlstate 40P01); ``base.retry_deadlocks`` runs such a transaction again, a
few times, so the error never reaches a caller.
"""

from django_durable.store.base import (
    LeaseLost,
    alias,
    atomic,
    db,
    engine,
    in_autocommit,
    notify_due,
    now,
    retry_deadlocks,
    send_after_commit,
)
from django_durable.store.batches import (
    record_duplicates,
    start_batch,
)
from django_durable.store.children import (
    lock_owned_state,
    run_outcomes,
    save_owned_state,
    waiting_parent_state,
    waiting_parents,
    wake_parent,
)
from django_durable.store.claims import (
    claim,
    next_due_at,
)
from django_durable.store.compensations import (
    begin_compensating,
    record_compensation_completed,
    record_compensation_failed,
)
from django_durable.store.depth import (
    queue_depths,
)
from django_durable.store.diagnostics import (
    connection_limits,
    database_clock,
    index_names,
    listening_sessions,
    notify_round_trip,
    outdated_functions,
)
from django_durable.store.estimates import (
    status_estimates,
)
from django_durable.store.flow import FlowLimit
from django_durable.store.flow_reads import (
    begins_in_window,
    due_by_key,
    running_by_key,
    running_of,
)
from django_durable.store.functions import (
    after_migrate,
)
from django_durable.store.handoffs import hand_off
from django_durable.store.holders import (
    active_children,
    cancel_run,
    get_holder,
    get_waiting_behind,
    lock_run,
    move_waiting_behind,
    release_key,
    replace_holder,
    resume_failed,
    take_key,
    take_key_and_run,
    update_pending_input,
    update_waiting_input,
    wait_behind,
    waiting_behind_finished,
)
from django_durable.store.observers import (
    watch_claims,
)
from django_durable.store.pruning import (
    prune_activity,
    prune_flow_rows,
    prune_runs,
)
from django_durable.store.queues import (
    due_now_by_workflow,
    paused_queues,
    queue_counts,
    set_paused,
)
from django_durable.store.reruns import (
    began_steps,
    make_rerun,
    replaced_values,
    rerun_already,
    reruns_of,
)
from django_durable.store.runs import (
    Recovery,
    claims_unknown_to,
    current_status,
    hand_back,
    hand_back_lost,
    keep_event,
    record_delivery,
    recover_expired_leases,
    renew_lease,
    waiting_for_input,
)
from django_durable.store.schedules import (
    advance_schedule,
    create_schedule,
    delete_undeclared_schedules,
    lock_due_schedules,
    lock_schedule,
    record_manual_fire,
    set_schedule_disabled,
    update_schedule,
)
from django_durable.store.schema import (
    has_table,
    unapplied_migrations,
)
from django_durable.store.starts import (
    DuplicateNote,
    InsertOrHolder,
    NewRun,
    insert_or_get_holder,
    insert_run,
    record_activity,
)
from django_durable.store.steps import (
    Completion,
    completed_attempt,
    kept_event,
    record_attempt_cancelled,
    record_completion,
    record_last_steps,
    record_run_failed,
    record_step_completed,
    record_step_failed,
    record_suspension,
)
from django_durable.store.streams import (
    StreamPosition,
    StreamWrite,
    close_stream,
    latest_stream_items,
    latest_values,
    notify_streams,
    read_stream,
    read_stream_items,
    release_side_connection,
    run_streams,
    stop_stream_notices,
    stream_channel,
    stream_payload,
    stream_position,
    stream_refusal,
    write_stream,
)
from django_durable.store.timers import (
    advance_timers,
)
from django_durable.store.workers import (
    WORKERS_KEPT,
    forget_dead_workers,
    notify_runs_due,
    open_listener,
    refuses_writes,
    register_worker,
    renew_leases,
    reset_connection_after_error,
    unregister_worker,
    worker_heartbeat,
)

__all__ = [
    "FlowLimit",
    "DuplicateNote",
    "InsertOrHolder",
    "NewRun",
    "LeaseLost",
    "Recovery",
    "active_children",
    "advance_schedule",
    "create_schedule",
    "delete_undeclared_schedules",
    "set_schedule_disabled",
    "update_schedule",
    "advance_timers",
    "alias",
    "atomic",
    "begin_compensating",
    "cancel_run",
    "claim",
    "current_status",
    "db",
    "forget_dead_workers",
    "get_holder",
    "get_waiting_behind",
    "lock_run",
    "lock_schedule",
    "record_delivery",
    "keep_event",
    "record_suspension",
    "kept_event",
    "hand_back",
    "hand_back_lost",
    "claims_unknown_to",
    "hand_off",
    "in_autocommit",
    "insert_or_get_holder",
    "insert_run",
    "engine",
    "lock_due_schedules",
    "lock_owned_state",
    "move_waiting_behind",
    "next_due_at",
    "notify_due",
    "notify_runs_due",
    "now",
    "open_listener",
    "due_now_by_workflow",
    "paused_queues",
    "prune_activity",
    "prune_flow_rows",
    "prune_runs",
    "began_steps",
    "make_rerun",
    "rerun_already",
    "replaced_values",
    "reruns_of",
    "queue_counts",
    "queue_depths",
    "record_activity",
    "record_attempt_cancelled",
    "record_compensation_completed",
    "record_compensation_failed",
    "record_duplicates",
    "record_manual_fire",
    "record_run_failed",
    "record_step_completed",
    "record_last_steps",
    "record_completion",
    "completed_attempt",
    "Completion",
    "record_step_failed",
    "recover_expired_leases",
    "register_worker",
    "release_key",
    "renew_lease",
    "waiting_for_input",
    "renew_leases",
    "replace_holder",
    "refuses_writes",
    "reset_connection_after_error",
    "resume_failed",
    "retry_deadlocks",
    "run_outcomes",
    "save_owned_state",
    "send_after_commit",
    "set_paused",
    "start_batch",
    "StreamPosition",
    "StreamWrite",
    "close_stream",
    "latest_stream_items",
    "latest_values",
    "notify_streams",
    "read_stream",
    "read_stream_items",
    "release_side_connection",
    "run_streams",
    "stop_stream_notices",
    "stream_channel",
    "stream_payload",
    "stream_position",
    "stream_refusal",
    "write_stream",
    "take_key",
    "take_key_and_run",
    "unregister_worker",
    "WORKERS_KEPT",
    "update_pending_input",
    "update_waiting_input",
    "wait_behind",
    "waiting_behind_finished",
    "waiting_parent_state",
    "waiting_parents",
    "wake_parent",
    "watch_claims",
    "worker_heartbeat",
    "connection_limits",
    "database_clock",
    "index_names",
    "listening_sessions",
    "notify_round_trip",
    "outdated_functions",
    "status_estimates",
    "begins_in_window",
    "due_by_key",
    "running_by_key",
    "running_of",
    "after_migrate",
    "has_table",
    "unapplied_migrations",
]

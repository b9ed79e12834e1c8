"""PostgreSQL plans of the store's statements, for the tests that check which index
each one reads. A statement that calls one of the store's functions
(store/functions.py) is explained as the statement in the function's body, with the
call's arguments: that is what PostgreSQL plans and runs."""

from __future__ import annotations

import re

from django.db import connection

from django_durable.models import Run
from django_durable.store.functions import CURRENT, definition


def _statement(create: str, pattern: str) -> str:
    """The statement of the function ``create`` that ``pattern`` finds (its group 1)."""
    return re.search(pattern, create, re.S).group(1)


START_FUNCTION = definition(CURRENT["durable_start"])
CLAIM_FUNCTION = definition(CURRENT["durable_claim"])
NEXT_DUE_AT_FUNCTION = definition(CURRENT["durable_next_due_at"])
# The start's look-up of the holder, and its insert.
HOLDER = _statement(START_FUNCTION, r"(SELECT h\.id.*?AND h\.holds_key)\s+INTO holder")
START_INSERT = _statement(START_FUNCTION, r"(INSERT INTO durable_run \(.*?DO NOTHING);")
# The claim's statements: its fast path's pick (no flow-keyed run due), the flow
# path's walk of a queue's keys in turns and its pick from the keys taken. The
# function's variables become values (its INTO clauses are PL/pgSQL's, not SQL's).
_CLAIM_PICK = _statement(
    CLAIM_FUNCTION,
    r"INTO v_ids, v_queues, v_workflows\s+FROM \((SELECT p\.\*.*?LIMIT p_limit)\) AS p;",
)
# The walk is the flow statement's first part: per queue, a lateral subquery of the
# queue (o.name) and its room (o.room).
_CLAIM_WALK = _statement(
    CLAIM_FUNCTION, r"\n\s*(WITH RECURSIVE walk.*?)\n\s*\) AS x\(flow_key, workflow, place, slots\)"
)
_CLAIM_FROM_KEYS = re.sub(
    r"\n\s*INTO v_ids, [^\n]*",
    " FROM claimed",
    _statement(CLAIM_FUNCTION, r"\n\s*(WITH pair AS .*?INTO v_ids, .*?FROM claimed);"),
)
# The pairs the walk took, in the flow statement: given instead, to plan the pick alone.
_PAIRS = re.compile(r"WITH pair AS MATERIALIZED \(.*?\n\s*\),\n(\s*lim AS)", re.S)
# The open queues served (the function's first statement), each with the claim's
# limit as its room.
_OPEN = "({})".format(
    _statement(CLAIM_FUNCTION, r"(SELECT array_agg\(s\.name.*?);").replace(" INTO v_open", "")
)
_SERVED = {
    "v_open": _OPEN,
    "v_room": f"array_fill(p_limit, ARRAY[cardinality({_OPEN})])",
    "v_now": "statement_timestamp()",
    "v_capped": "'{}'::text[]",
}
CLAIM_QUERY = re.sub(r"\bv_\w+\b", lambda m: _SERVED[m.group(0)], _CLAIM_PICK)
# The flow path's statements, for a claim that names its queues (the function has
# found them already: a variable there).
_NAMED = {
    **_SERVED,
    "v_open": "p_queues",
    "v_room": "array_fill(p_limit, ARRAY[cardinality(p_queues)])",
}


def _sql_array(values, type_: str) -> str:
    items = ", ".join(
        "NULL" if v is None else str(v) if isinstance(v, int) else "'" + v.replace("'", "''") + "'"
        for v in values
    )
    return f"ARRAY[{items}]::{type_}[]"


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'::text"


def claim_walk_query(queue: str) -> str:
    """The flow path's walk of one queue's keys in turns from its pointer (its newest
    durable_flow_turn row, read in the statement), trying each key's lock, for a plan
    (the function's flow statement walks each queue with room, in a lateral subquery)."""
    walk = _CLAIM_WALK.replace("o.name", _text(queue)).replace("o.room", "p_limit")
    return re.sub(r"\bv_\w+\b", lambda m: _NAMED[m.group(0)], walk)


def claim_flow_query(chosen: list[tuple[str, str | None, str | None]]) -> str:
    """The flow path's pick from the keys ``chosen`` ((queue, flow key, workflow),
    None for a queue's runs without a flow key), for a plan (the function's flow
    statement takes them from its walk)."""
    queues, keys, workflows = zip(*chosen, strict=True)
    pairs = (  # no key's slots: its plan alike
        "WITH pair AS MATERIALIZED (SELECT p.*, NULL::integer[] AS slots "
        f"FROM unnest({_sql_array(queues, 'text')}, {_sql_array(keys, 'text')}, "
        f"{_sql_array(workflows, 'text')}, {_sql_array(range(1, len(chosen) + 1), 'numeric')}) "
        "AS p(queue, flow_key, workflow, place)),\n\\1"
    )
    query = _PAIRS.sub(pairs, _CLAIM_FROM_KEYS, count=1)
    return re.sub(r"\bv_\w+\b", lambda m: _NAMED[m.group(0)], query)


# The room of each queue served (counted after the queues' locks, with the gate) and the claim's
# last statement (the rate slots, each run's slots, the UPDATE), for the ids given.
_CLAIM_ROOM = _statement(CLAIM_FUNCTION, r"(WITH o AS \(SELECT o\.name.*?)\s+INTO v_room, [^;]*;")
CLAIM_ROOM_QUERY = re.sub(r"\bv_\w+\b", lambda m: _NAMED[m.group(0)], _CLAIM_ROOM)
_CLAIM_SLOTS = _statement(CLAIM_FUNCTION, r"RETURN QUERY\s+(WITH rated AS .*?d\.queue_slot);")


def claim_slots_query(ids: list[str]) -> str:
    """The claim's last statement for the runs ``ids`` (no begins), for a plan (the
    function passes their queues, workflows and flow keys beside them)."""
    runs = [Run.objects.get(id=i) for i in ids]
    values = {
        **_NAMED,
        "v_ids": f"ARRAY[{', '.join(repr(str(i)) for i in ids)}]::uuid[]",
        "v_queues": _sql_array([r.queue for r in runs], "text"),
        "v_workflows": _sql_array([r.workflow for r in runs], "text"),
        "v_keys": _sql_array([r.flow_key for r in runs], "text"),
        "v_key_slots": _sql_array([r.flow_slot for r in runs], "integer"),
        "v_rate_slots": f"array_fill(NULL::integer, ARRAY[{len(ids)}])",
    }
    return re.sub(r"\bv_\w+\b", lambda m: values[m.group(0)], _CLAIM_SLOTS)


NEXT_DUE_AT_QUERY = _statement(NEXT_DUE_AT_FUNCTION, r"RETURN \(\s+(.*?)\s*\);\s*END")

# Each function: its CREATE statement (for the arguments' names and types) and the
# statement its body runs.
FUNCTION_QUERIES = {
    # The start's look-up of the holder (its INSERT is a plain insert of one row, and
    # the duplicate's activity row one of a row of values).
    CURRENT["durable_start"]: (START_FUNCTION, HOLDER),
    CURRENT["durable_claim"]: (CLAIM_FUNCTION, CLAIM_QUERY),
    CURRENT["durable_next_due_at"]: (NEXT_DUE_AT_FUNCTION, NEXT_DUE_AT_QUERY),
}


def explain_function(
    create: str, query: str, values: list, *, generic: bool, analyze: bool = False
) -> str:
    """The plan of ``query``, the statement in the body of the function ``create``
    defines, for the arguments ``values``: its generic plan (the one the function
    keeps for the session: it sets plan_cache_mode) or one planned for these values,
    under the settings the function sets for itself (``SET jit = off``). Each
    argument's name in ``query`` becomes its ``$n``, as the function binds it.
    ``analyze``: run it too, with the pages each step read (EXPLAIN ANALYZE, BUFFERS)."""
    signature = re.search(r"FUNCTION \w+\((.*?)\)\s*RETURNS", create, re.S).group(1)
    arguments = [argument.split() for argument in signature.split(",")]
    numbered = query
    for n, (name, _type) in enumerate(arguments, 1):
        numbered = re.sub(rf"\b{name}\b", f"${n}", numbered)
    types = ", ".join(type_ for _name, type_ in arguments)
    header = re.split(r"^AS \$", create, maxsplit=1, flags=re.M)[0]
    settings = re.findall(r"^SET (\w+) = (\w+)$", header, re.M)
    return explain_prepared(
        numbered, values, types=types, settings=settings, generic=generic, analyze=analyze
    )


def explain_prepared(
    sql: str,
    values: list,
    *,
    types: str = "",
    settings=(),
    generic: bool = True,
    analyze: bool = False,
) -> str:
    """The plan of ``sql`` (``$n`` placeholders) as a prepared statement executed with
    ``values``: its generic plan, which PostgreSQL plans once for any values (what a
    function, or a project that prepares statements, runs after the first
    executions), or one planned for these values; under ``settings`` (name, value)."""
    mode = "force_generic_plan" if generic else "force_custom_plan"
    with connection.cursor() as cursor:
        for name, value in settings:
            cursor.execute(f"SET {name} = {value}")
        cursor.execute(f"SET plan_cache_mode = {mode}")
        cursor.execute(f"PREPARE explained{f'({types})' if types else ''} AS {sql}")
        try:
            placeholders = ", ".join(["%s"] * len(values))
            options = "(ANALYZE, BUFFERS) " if analyze else ""
            cursor.execute(f"EXPLAIN {options}EXECUTE explained({placeholders})", values)
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE explained")
            for name in {"plan_cache_mode", *(name for name, _value in settings)}:
                cursor.execute(f"RESET {name}")


def explain(sql: str, *, generic: bool = False) -> str:
    """The plan of a statement as the cursor sent it (parameters inlined); for a
    call of a store function, the plan of the function's statement with the call's
    arguments (evaluated by a SELECT of the call's own argument list)."""
    for name, (create, query) in FUNCTION_QUERIES.items():
        call = re.search(rf"\b{name}\((.*)\)\s*$", sql.strip(), re.S)
        if call is not None:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT {call.group(1)}")
                values = list(cursor.fetchone())
            return explain_function(create, query, values, generic=generic)
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}")
        return "\n".join(row[0] for row in cursor.fetchall())

"""PostgreSQL plans of the store's statements, for the tests that check which index
each one reads. A statement that calls one of the store's functions
(store/functions.py) is explained as the statement in the function's body, with the
call's arguments: that is what PostgreSQL plans and runs."""

from __future__ import annotations

import re

from django.db import connection

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
# The claim (without flow keys due: durable_claim_v1's statement; with them, the flow
# path's claim in one statement, its walk of a queue's keys level by level, and its
# claim from the keys held), and the next due time.
CLAIM_QUERY = _statement(CLAIM_FUNCTION, r"RETURN QUERY\s+(.*?);\s*RETURN;")
_CLAIM_ONE_STATEMENT = _statement(
    CLAIM_FUNCTION,
    r"RETURN QUERY\s+(WITH RECURSIVE queue\(room, pointer\).*?RETURNING durable_run\.\*);",
)
# (Its INTO clause is PL/pgSQL's, not SQL's.)
_CLAIM_WALK = re.sub(
    r"\n\s*INTO v_level, [^\n]*",
    "",
    _statement(
        CLAIM_FUNCTION, r"\n    -- 3\. The keys, per queue.*?(WITH RECURSIVE queue.*?\) AS got);"
    ),
)
_CLAIM_FROM_KEYS = _statement(
    CLAIM_FUNCTION, r"\n    -- 5\. The claim:.*?RETURN QUERY\s+(.*?);\s*END"
)


def _sql_array(values, type_: str) -> str:
    items = ", ".join(
        "NULL" if v is None else str(v) if isinstance(v, int) else "'" + v.replace("'", "''") + "'"
        for v in values
    )
    return f"ARRAY[{items}]::{type_}[]"


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'::text"


def claim_one_statement_query(queue: str) -> str:
    """The flow path's claim in one statement (step 2), of the queue ``queue``, for a
    plan (the function binds the queue as its variable)."""
    return re.sub(r"\bv_name\b", _text(queue), _CLAIM_ONE_STATEMENT)


def claim_walk_query(queue: str, pointer: str = "") -> str:
    """The flow path's walk of one queue's keys at its highest priority level, from
    its pointer, trying each key's lock (step 3), for a plan (the function binds these
    as its loop's variables)."""
    values = {
        "v_name": _text(queue),
        "v_bound": "2147483647",
        "v_room": "NULL::integer",
        "v_pointer": _text(pointer),
        "v_pos": "0",
        "v_probing": "false",
        "v_full": "'{}'::text[]",
    }
    return re.sub(r"\bv_\w+\b", lambda m: values[m.group(0)], _CLAIM_WALK)


def claim_flow_query(chosen: list[tuple[str, str | None, str | None]]) -> str:
    """The flow path's claim from the keys ``chosen`` ((queue, flow key, workflow),
    None for a queue's runs without a flow key), one run of each, at priority 0, its
    clock the statement's, for a plan (the function passes them as arrays)."""
    queues, keys, workflows = zip(*chosen, strict=True)
    n = len(chosen)
    values = {
        "v_queues": _sql_array(queues, "text"),
        "v_keys": _sql_array(keys, "text"),
        "v_workflows": _sql_array(workflows, "text"),
        "v_levels": _sql_array([0] * n, "integer"),
        "v_places": _sql_array(list(range(1, n + 1)), "integer"),
        "v_allots": _sql_array([1] * n, "integer"),
        "v_resumeds": _sql_array([None] * n, "integer"),
        "v_capped": "'{}'::text[]",
        "v_capped_room": "'{}'::integer[]",
        "v_full": "'{}'::text[]",
        "v_now": "statement_timestamp()",
    }
    return re.sub(r"\bv_\w+\b", lambda m: values[m.group(0)], _CLAIM_FROM_KEYS)


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


def explain_function(create: str, query: str, values: list, *, generic: bool) -> str:
    """The plan of ``query``, the statement in the body of the function ``create``
    defines, for the arguments ``values``: its generic plan (the one the function
    keeps for the session: it sets plan_cache_mode) or one planned for these values,
    under the settings the function sets for itself (``SET jit = off``). Each
    argument's name in ``query`` becomes its ``$n``, as the function binds it."""
    signature = re.search(r"FUNCTION \w+\((.*?)\)\s*RETURNS", create, re.S).group(1)
    arguments = [argument.split() for argument in signature.split(",")]
    numbered = query
    for n, (name, _type) in enumerate(arguments, 1):
        numbered = re.sub(rf"\b{name}\b", f"${n}", numbered)
    types = ", ".join(type_ for _name, type_ in arguments)
    header = re.split(r"^AS \$", create, maxsplit=1, flags=re.M)[0]
    settings = re.findall(r"^SET (\w+) = (\w+)$", header, re.M)
    return explain_prepared(numbered, values, types=types, settings=settings, generic=generic)


def explain_prepared(
    sql: str, values: list, *, types: str = "", settings=(), generic: bool = True
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
            cursor.execute(f"EXPLAIN EXECUTE explained({placeholders})", values)
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

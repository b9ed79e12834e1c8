"""The partitioned layout of docs/scaling.md, tried on PostgreSQL's declarative
partitioning: what holds and what breaks.

A copy of the runs table's key rules (the one-holder-per-key partial unique index,
the status check) is made in the test database, partitioned by hash of (workflow,
key). The key constraint then lives inside one partition: two holders of one key
land in the same partition and the second is refused. What breaks is shown too:
a primary key on ``id`` alone, a foreign key to ``id`` (step attempts, events,
children), and a key constraint on a table partitioned by time (so pruning by
dropping a partition and a database-enforced key cannot both be had).
"""

import uuid

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

PARTITIONS = 4

HASH_LAYOUT = [
    """
    CREATE TABLE part_run (
        id uuid NOT NULL,
        workflow varchar(200) NOT NULL,
        key varchar(255),
        holds_key boolean NOT NULL DEFAULT false,
        status varchar(20) NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT part_run_status_valid CHECK (status IN ('pending', 'running', 'waiting',
            'compensating', 'completed', 'failed', 'cancelled', 'compensated',
            'compensation_failed')),
        CONSTRAINT part_run_holder_has_key CHECK (NOT holds_key OR key IS NOT NULL)
    ) PARTITION BY HASH (workflow, key)
    """,
    *(
        f"CREATE TABLE part_run_{i} PARTITION OF part_run "
        f"FOR VALUES WITH (MODULUS {PARTITIONS}, REMAINDER {i})"
        for i in range(PARTITIONS)
    ),
    # The key rule of durable_run_one_holder_per_key: allowed because it holds the
    # partitioning columns; each partition gets its own unique index.
    "CREATE UNIQUE INDEX part_run_one_holder_per_key ON part_run (workflow, key) WHERE holds_key",
    # Runs are found by id through a plain index (a unique one is refused below).
    "CREATE INDEX part_run_id ON part_run (id)",
]


def execute(sql: str, params=None) -> list:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def refused(sql: str) -> str:
    """Run ``sql`` in a savepoint; the database's refusal message (the test fails if
    it is accepted)."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql)
    except DatabaseError as exc:
        return str(exc)
    pytest.fail(f"PostgreSQL accepted: {sql}")


def insert(workflow: str, key: str | None, holds: bool, status: str = "pending") -> uuid.UUID:
    run_id = uuid.uuid4()
    execute(
        "INSERT INTO part_run (id, workflow, key, holds_key, status) VALUES (%s, %s, %s, %s, %s)",
        [run_id, workflow, key, holds, status],
    )
    return run_id


def partition_of(run_id: uuid.UUID) -> str:
    return execute("SELECT tableoid::regclass::text FROM part_run WHERE id = %s", [run_id])[0][0]


@pytest.fixture
def hash_layout():
    for sql in HASH_LAYOUT:
        execute(sql)


def test_the_runs_of_a_key_share_one_partition(hash_layout):
    """Hash of (workflow, key): every run of a key, holder or not, in one partition."""
    for n in range(40):
        runs = [insert("orders", f"order:{n}", i == 2, "completed") for i in range(3)]
        assert len({partition_of(run_id) for run_id in runs}) == 1
    spread = execute("SELECT count(DISTINCT tableoid) FROM part_run")[0][0]
    assert spread == PARTITIONS  # and the keys spread over every partition


def test_a_second_holder_of_a_key_is_refused_inside_its_partition(hash_layout):
    insert("orders", "order:1", True)
    insert("orders", "order:1", False, "completed")  # history of the key: allowed
    insert("emails", "order:1", True)  # the same key of another workflow: allowed
    with pytest.raises(IntegrityError, match="duplicate key"), transaction.atomic():
        insert("orders", "order:1", True)
    assert execute(
        "SELECT count(*) FROM part_run WHERE workflow = 'orders' AND key = 'order:1' AND holds_key"
    ) == [(1,)]


def test_a_hand_off_moves_the_key_inside_one_partition(hash_layout):
    """The hand-off of a start (release the finished holder, insert the new one) is one
    statement on one partition: the constraint is checked as on the plain table."""
    old = insert("orders", "order:7", True, "completed")
    new = uuid.uuid4()
    execute(
        """
        WITH released AS (UPDATE part_run SET holds_key = false
                          WHERE workflow = 'orders' AND key = 'order:7' AND holds_key
                          RETURNING id)
        INSERT INTO part_run (id, workflow, key, holds_key, status)
        SELECT %s, 'orders', 'order:7', true, 'pending' FROM released
        """,
        [new],
    )
    holders = execute(
        "SELECT id FROM part_run WHERE workflow = 'orders' AND key = 'order:7' AND holds_key"
    )
    assert holders == [(new,)]
    assert partition_of(old) == partition_of(new)


def test_a_lookup_of_a_key_reads_one_partition(hash_layout):
    for n in range(200):
        insert("orders", f"order:{n}", True)
    execute("ANALYZE part_run")
    plan = "\n".join(
        row[0]
        for row in execute(
            "EXPLAIN SELECT id FROM part_run WHERE workflow = 'orders' AND key = 'order:5' "
            "AND holds_key"
        )
    )
    scanned = {f"part_run_{i}" for i in range(PARTITIONS) if f"part_run_{i} " in plan + " "}
    assert len(scanned) == 1, plan


def test_unkeyed_runs_all_land_in_one_partition(hash_layout):
    """A NULL key hashes like any value: runs without a key (children, parallel
    branches, most runs of many projects) all go to one partition. A limit of the
    layout: hash (workflow, coalesce(key, id)) would spread them, but an expression
    can't carry the unique index."""
    runs = [insert(f"workflow_{n % 5}", None, False) for n in range(50)]
    per_workflow = {}
    for n, run_id in enumerate(runs):
        per_workflow.setdefault(n % 5, set()).add(partition_of(run_id))
    assert all(len(partitions) == 1 for partitions in per_workflow.values())


def test_what_breaks_a_primary_key_or_a_foreign_key_on_id_alone(hash_layout):
    message = refused("ALTER TABLE part_run ADD PRIMARY KEY (id)")
    assert "partition" in message.lower()
    message = refused("CREATE UNIQUE INDEX part_run_id_unique ON part_run (id)")
    assert "partition" in message.lower()
    # Step attempts, events and children point at a run by id: with no unique id
    # on the partitioned table, a foreign key to it is refused.
    message = refused(
        "CREATE TABLE part_attempt (id bigserial PRIMARY KEY, run_id uuid REFERENCES part_run (id))"
    )
    assert "no unique constraint" in message.lower()


def test_what_breaks_the_key_constraint_on_a_table_partitioned_by_time():
    """Partitions by month make pruning a DROP of the oldest partition, but the key
    constraint must then include the time column: a key could have a holder in each
    month. The database refuses the index that would say otherwise."""
    execute(
        """
        CREATE TABLE time_run (
            id uuid NOT NULL, workflow varchar(200) NOT NULL, key varchar(255),
            holds_key boolean NOT NULL DEFAULT false, created_at timestamptz NOT NULL
        ) PARTITION BY RANGE (created_at)
        """
    )
    execute(
        "CREATE TABLE time_run_2026_11 PARTITION OF time_run "
        "FOR VALUES FROM ('2026-11-01') TO ('2026-12-01')"
    )
    execute(
        "CREATE TABLE time_run_2026_12 PARTITION OF time_run "
        "FOR VALUES FROM ('2026-12-01') TO ('2027-01-01')"
    )
    message = refused(
        "CREATE UNIQUE INDEX time_run_one_holder ON time_run (workflow, key) WHERE holds_key"
    )
    assert "partition" in message.lower()
    # With the time column in it, the index is accepted, and it no longer keeps one
    # holder per key: two months, two holders.
    execute(
        "CREATE UNIQUE INDEX time_run_one_holder ON time_run (workflow, key, created_at) "
        "WHERE holds_key"
    )
    for when in ("2026-11-15", "2026-12-15"):
        execute(
            "INSERT INTO time_run (id, workflow, key, holds_key, created_at) "
            "VALUES (%s, 'orders', 'order:1', true, %s)",
            [uuid.uuid4(), when],
        )
    assert execute("SELECT count(*) FROM time_run WHERE holds_key") == [(2,)]
    # What it buys: pruning a month is a DETACH and a DROP, not a DELETE of its rows.
    execute("ALTER TABLE time_run DETACH PARTITION time_run_2026_11")
    execute("DROP TABLE time_run_2026_11")
    assert execute("SELECT count(*) FROM time_run") == [(1,)]

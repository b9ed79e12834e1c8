"""Remove each guard of the claim in turn and show which test catches it (issue 41;
not run in CI: each mutation builds a fresh PostgreSQL test database).

Each mutation is applied to a copy of the tree (durable_claim_v6's SQL, the initial
migration or the store's code), then the claim's guard tests run against the copy:

    PYTHONPATH=$PWD DURABLE_TEST_DB_NAME=t_mutate .venv/bin/python scripts/mutate_claim.py

It prints one line per mutation: the first test that failed, or "NOT CAUGHT".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLAIM = "django_durable/migrations/sql/durable_claim_v6.sql"
TESTS = ["tests/test_flow_claim_locks.py", "tests/test_flow_slots.py", "tests/test_flow_control.py"]
# The slot indexes as a fresh database gets them (the squashed 0.3.0 migration).
INITIAL = "django_durable/migrations/0001_0_3_initial.py"


def slot_index(name: str) -> str:
    """The AddConstraint of the unique slot index ``name`` in INITIAL."""
    return (
        r"\n        migrations\.AddConstraint\(\n            model_name=\"run\",\n"
        r"            constraint=models\.UniqueConstraint\(\n(?:(?!AddConstraint).)*?"
        rf"name=\"{name}\",\n            \),\n        \),"
    )


ROOM = (
    r"ELSE GREATEST\(l\.cap - (\(\s+SELECT count\(\*\) FROM durable_run AS h"
    r" WHERE h\.queue = o\.name\s+AND durable_holds_worker_v1\(h\.status,"
    r" h\.lease_expires_at\)\)), 0\)"
)

# name: (file, pattern, replacement); each pattern must match exactly once.
MUTATIONS = {
    "queue lock not waited for": (
        CLAIM,
        r"PERFORM pg_advisory_xact_lock\(hashtextextended\("
        r"'django_durable\.queue:' \|\| o, 0\)\)",
        "PERFORM true",
    ),
    "workflow lock not waited for": (
        CLAIM,
        r"PERFORM pg_advisory_xact_lock\(hashtextextended\("
        r"'django_durable\.workflow:' \|\| w, 0\)\)",
        "PERFORM true",
    ),
    "limited key's lock not tried shared (v5 not kept out)": (
        CLAIM,
        r"\n\s+WHEN l\.rate IS NULL AND NOT pg_try_advisory_xact_lock_shared\(.*?THEN NULL",
        "",
    ),
    "rate-limited key's lock not tried (always taken)": (
        CLAIM,
        r"\n\s+WHEN l\.rate IS NOT NULL AND NOT pg_try_advisory_xact_lock\(.*?THEN NULL",
        "",
    ),
    "key slot's lock not tried (always taken)": (
        CLAIM,
        r"WHERE pg_try_advisory_xact_lock\(hashtextextended\(\s+"
        r"'django_durable\.flow_slot:'.*?, 0\)\)",
        "WHERE true",
    ),
    "key slots held not left out": (CLAIM, r"WHERE g\.s <> ALL \(h\.held\)", "WHERE true"),
    "key's room not counted (its free slots instead)": (
        CLAIM,
        r"l\.key_cap - count\(\*\)",
        "l.key_cap - count(h.flow_slot) FILTER (WHERE h.flow_slot < l.key_cap)",
    ),
    "key slot committed since read free not dropped": (
        CLAIM,
        r"\n\s+AND \(c\.key_slot IS NULL OR NOT EXISTS \(.*?h\.lease_expires_at\)\)\)",
        "",
    ),
    "queue room not recounted after the lock (the limit instead)": (CLAIM, ROOM, "ELSE l.cap"),
    "queue room not floored at 0": (CLAIM, ROOM, r"ELSE (l.cap - \1)"),
    "rate slot taken even if begun within per": (
        CLAIM,
        r"\n\s+WHERE b\.begun_at <= v_now - \(SELECT l\.per.*?WHERE l\.workflow = b\.workflow\)",
        "",
    ),
    "a run with no free slot claimed anyway": (
        CLAIM,
        r"\n\s+HAVING count\(sc\.id\) = count\(free\.slots\[sc\.n\]\)[^\n]*",
        "",
    ),
    "READ COMMITTED not set for the claim": (
        "django_durable/store/engines/postgres.py",
        r"(def sets_claim_level\(connection\) -> bool:\n    \"\"\".*?\"\"\"\n)",
        r"\1    return False\n",
    ),
    "queue slot index dropped": (INITIAL, slot_index("durable_run_queue_slot"), ""),
    "flow key slot index dropped": (INITIAL, slot_index("durable_run_flow_slot"), ""),
    "workflow slot index dropped": (INITIAL, slot_index("durable_run_workflow_slot"), ""),
}


def mutated_copy(path: str, pattern: str, replacement: str) -> Path:
    copy = Path(tempfile.mkdtemp(prefix="mutate_claim_"))
    for name in ("django_durable", "tests", "conftest.py", "pyproject.toml", "manage.py"):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy(source, copy / name)
    target = copy / path
    text, count = re.subn(pattern, replacement, target.read_text(), flags=re.S)
    if count != 1:
        raise SystemExit(f"{path}: {pattern!r} matched {count} times")
    target.write_text(text)
    return copy


def first_failure(copy: Path) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": str(copy),
        "DURABLE_TEST_DB": "postgres",
        "DURABLE_TEST_DB_NAME": os.environ.get("DURABLE_TEST_DB_NAME", "t_mutate"),
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--create-db",
         *TESTS],
        cwd=copy, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", result.stdout, re.M)
    return failed[0] if failed else "NOT CAUGHT"


def main() -> None:
    wanted = sys.argv[1:]
    for name, (path, pattern, replacement) in MUTATIONS.items():
        if wanted and not any(w in name for w in wanted):
            continue
        copy = mutated_copy(path, pattern, replacement)
        try:
            print(f"{name:<62} {first_failure(copy)}", flush=True)
        finally:
            shutil.rmtree(copy)


if __name__ == "__main__":
    main()

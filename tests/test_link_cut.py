"""A worker whose network link is cut (no reset, no FIN: packets just stop), on a
network namespace and a veth pair of the test's own, against a cluster of its own.

With the keepalive and ``tcp_user_timeout`` settings docs/production.md recommends
(``tests/standby_pair.HA_OPTIONS``), the cut worker notices within seconds and says
so once; another worker recovers its runs at their leases' expiry, and the fence
refuses what the cut worker still tries to write for them; once the link is back
the cut worker reconnects within seconds and works again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import own_cluster
from tests.standby_pair import HA_OPTIONS
from tests.worker_processes import ROOT, WorkerProcess, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

OUT_OF_REACH = "the database is out of reach"
BACK = "the database is back"
RUNS = 6


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def namespaces_refused() -> str | None:
    """Why this machine cannot make a network namespace of the test's own, or None."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"ddprobe{os.getpid()}"
    made = ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"`ip netns add` was refused: {made.stderr.strip()}"
    ip("netns", "del", name, check=False)
    return None


class Link:
    """A namespace whose only way out is a veth pair to the host: cutting the host's
    end drops every packet without a reset, as a failed switch or route does."""

    def __init__(self) -> None:
        n = os.getpid() % 250
        self.namespace = f"ddcut{os.getpid()}"
        self.host_side, self.inner_side = f"ddh{os.getpid()}", f"ddn{os.getpid()}"
        self.host_ip, self.inner_ip = f"10.213.{n}.1", f"10.213.{n}.2"

    def create(self) -> None:
        self.remove()
        ip("netns", "add", self.namespace)
        ip("link", "add", self.host_side, "type", "veth", "peer", "name", self.inner_side)
        ip("link", "set", self.inner_side, "netns", self.namespace)
        ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_side)
        ip("link", "set", self.host_side, "up")
        inside = ("netns", "exec", self.namespace, "ip")
        ip(*inside, "addr", "add", f"{self.inner_ip}/30", "dev", self.inner_side)
        ip(*inside, "link", "set", self.inner_side, "up")
        ip(*inside, "link", "set", "lo", "up")

    def cut(self) -> None:
        ip("link", "set", self.host_side, "down")

    def heal(self) -> None:
        ip("link", "set", self.host_side, "up")

    def remove(self) -> None:
        ip("link", "del", self.host_side, check=False)
        ip("netns", "del", self.namespace, check=False)


class NamespacedWorker(WorkerProcess):
    """``manage.py durable_worker`` run inside ``namespace`` (``ip netns exec``)."""

    def __init__(self, namespace: str, args: list[str], env: dict, log_path: Path):
        self.args = args
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", namespace, sys.executable, "manage.py", "durable_worker",
                 *args],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip


@pytest.fixture
def link():
    refused = namespaces_refused()
    if refused is not None:
        pytest.skip(f"no network namespace of the test's own: {refused}")
    made = Link()
    try:
        made.create()
        yield made
    finally:
        made.remove()


@pytest.fixture
def cluster(link):
    if not own_cluster.available():
        pytest.skip("pg_createcluster is not installed")
    with own_cluster.own_cluster("linkcut", {"listen_addresses": "*"}) as pg:
        hba = Path(f"/etc/postgresql/{pg.release}/{pg.name}/pg_hba.conf")
        hba.write_text(hba.read_text() + f"host all all {link.inner_ip}/32 trust\n")
        pg.ctl("reload")
        yield pg


def count(pg: own_cluster.OwnCluster, sql: str) -> int:
    return pg.scalar(sql) or 0


def test_a_worker_cut_off_is_fenced_and_works_again_within_seconds_of_the_heal(
    link, cluster, tmp_path
):
    timing = {"DURABLE_LEASE_SECONDS": "4", "DURABLE_HEARTBEAT_SECONDS": "1"}
    timing["DURABLE_POLL_SECONDS"] = "0.2"
    inner_env = cluster.env(
        PGHOST=link.host_ip, DURABLE_TEST_DB_OPTIONS=json.dumps(HA_OPTIONS), **timing
    )
    cut_off = NamespacedWorker(
        link.namespace, ["--worker-id", "cut", "--concurrency", "2"], inner_env,
        tmp_path / "cut.log",
    )  # fmt: skip
    rescuer = None
    try:
        cut_off.wait_for_output("serves", timeout=60)
        assert cluster.probe("start", "--runs", str(RUNS), "--pause", "3")["started"] == RUNS
        held = "SELECT count(*) FROM durable_run WHERE worker_id = 'cut' AND status = 'running'"
        wait_until(lambda: count(cluster, held) == 2, 60, "two runs held by the cut worker")
        done_by_cut = "SELECT count(*) FROM durable_step_attempt WHERE worker_id = 'cut' " \
            "AND status = 'completed'"  # fmt: skip

        link.cut()
        cut_at = time.monotonic()
        recorded_before_cut = count(cluster, done_by_cut)
        rescuer = WorkerProcess(
            ["--worker-id", "rescuer", "--concurrency", "4"], cluster.env(**timing),
            tmp_path / "rescuer.log",
        )  # fmt: skip
        cut_off.wait_for_output(OUT_OF_REACH, timeout=60)
        noticed = time.monotonic() - cut_at
        completed = "SELECT count(*) FROM durable_run WHERE status = 'completed'"
        wait_until(lambda: count(cluster, completed) == RUNS, 120, "every run, by the rescuer")

        link.heal()
        healed_at = time.monotonic()
        cut_off.wait_for_output(BACK, timeout=60)
        back = time.monotonic() - healed_at
        # Fenced: nothing the cut worker finished during the cut was recorded.
        assert count(cluster, done_by_cut) == recorded_before_cut
        rescuer.send(signal.SIGTERM)
        assert rescuer.wait(60) == 0

        # At work again: only the cut worker is left to run these.
        assert cluster.probe("start", "--runs", "3", "--first", str(RUNS))["started"] == 3
        wait_until(lambda: count(cluster, completed) == RUNS + 3, 60, "three runs after the heal")
        report = cluster.probe("report")
    finally:
        cut_off.send(signal.SIGTERM)
        code = cut_off.wait(60)
        if rescuer is not None:
            rescuer.kill()
    assert code == 0
    assert report["statuses"] == {"completed": RUNS + 3}, report["failed_errors"]
    assert report["holders_per_key"] == [1]
    assert count(cluster, done_by_cut) > recorded_before_cut  # it worked after the heal
    log = cut_off.output()
    assert log.count(OUT_OF_REACH) == 1, log
    assert " ERROR " not in log and "Traceback" not in log, log
    print(
        f"\nthe cut worker said the database was out of reach {noticed:.1f}s after the cut "
        f"and back {back:.1f}s after the heal; {report['recoveries']} runs recovered from it"
    )

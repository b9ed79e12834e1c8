#!/usr/bin/env bash
# The demo: the example project on SQLite with a worker, traffic and the dashboard.
# Ctrl-C stops everything it started.
#
#   DEMO_PORT (8000), DEMO_HOST (127.0.0.1): where the dashboard is served.
#   DEMO_USERNAME / DEMO_PASSWORD (admin / admin): the login it creates.
#   DEMO_LOGS (.demo): the worker's, the traffic's and the web server's logs.
#   SQLITE_PATH (demo.sqlite3): the database file.
#
# `scripts/demo.sh --check-port` only checks that DEMO_PORT is free (make demo runs
# it before installing anything).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-.venv/bin/python}"
HOST="${DEMO_HOST:-127.0.0.1}"
PORT="${DEMO_PORT:-8000}"
USERNAME="${DEMO_USERNAME:-admin}"
PASSWORD="${DEMO_PASSWORD:-admin}"
LOGS="${DEMO_LOGS:-.demo}"
export DJANGO_SETTINGS_MODULE=example_project.settings
export PYTHONUNBUFFERED=1

# A port someone listens on, before anything starts. SO_REUSEADDR like runserver's,
# so a port a previous demo just left (TIME_WAIT) counts as free.
port_is_free() {
    "$PY" - "$HOST" "$PORT" <<'PYTHON'
import socket
import sys

probe = socket.socket()
probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    probe.bind((sys.argv[1], int(sys.argv[2])))
except OSError:
    sys.exit(1)
finally:
    probe.close()
PYTHON
}
if ! port_is_free; then
    echo "demo: port $PORT on $HOST is already in use, so the dashboard can't be served there." >&2
    echo "demo: stop what uses it, or choose another port: DEMO_PORT=8001 make demo" >&2
    exit 1
fi
if [ "${1:-}" = "--check-port" ]; then
    exit 0
fi

mkdir -p "$LOGS"
echo "demo: creating the database, the login and the first traffic..."
"$PY" manage.py migrate --noinput -v 0
DEMO_USERNAME="$USERNAME" DEMO_PASSWORD="$PASSWORD" "$PY" manage.py shell -v 0 -c "
import os
from django.contrib.auth import get_user_model
user, _ = get_user_model().objects.get_or_create(username=os.environ['DEMO_USERNAME'])
user.is_staff = user.is_superuser = True
user.set_password(os.environ['DEMO_PASSWORD'])
user.save()
"
"$PY" manage.py durable_traffic --seed 1 > "$LOGS/traffic.log"

pids=()
names=()
stop() {
    trap - INT TERM EXIT
    echo
    echo "demo: stopping the worker, the traffic and the web server..."
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
# Ctrl-C (or a TERM) is how the demo is meant to end: exit 0 after stopping.
trap 'stop; exit 0' INT TERM
trap stop EXIT

start() {  # start NAME COMMAND...: in the background, its output in $LOGS/NAME.log
    local name=$1
    shift
    "$@" >> "$LOGS/$name.log" 2>&1 &
    pids+=($!)
    names+=("$name")
}
: > "$LOGS/worker.log"
: > "$LOGS/server.log"
# One worker thread: SQLite takes one write at a time (more would only take turns).
start worker "$PY" manage.py durable_worker
start traffic "$PY" manage.py durable_traffic --forever --every 20
start server "$PY" manage.py runserver "$HOST:$PORT" --noreload

# Ready: the web server answers and the worker has said what it serves.
ready() {
    [ "$(grep -c '^worker ' "$LOGS/worker.log")" -ge 2 ] || return 1
    "$PY" -c "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()" \
        "$HOST" "$PORT" 2>/dev/null
}
for _ in $(seq 300); do
    ready && break
    for i in "${!pids[@]}"; do
        if ! kill -0 "${pids[$i]}" 2>/dev/null; then
            echo "demo: the ${names[$i]} stopped; its log, $LOGS/${names[$i]}.log:" >&2
            tail -n 30 "$LOGS/${names[$i]}.log" >&2
            exit 1
        fi
    done
    sleep 0.2
done
ready || { echo "demo: the worker or the web server is not up after a minute; see $LOGS/" >&2; exit 1; }

grep '^worker ' "$LOGS/worker.log"
cat <<INFO

  django-durable demo
  Dashboard: http://$HOST:$PORT/admin/durable/
  Login:     $USERNAME / $PASSWORD
  The worker runs the workflows; new traffic arrives every 20 seconds.
  Logs:      $LOGS/worker.log, $LOGS/traffic.log, $LOGS/server.log
  Press Ctrl-C to stop.

INFO
status=0
wait -n "${pids[@]}" || status=$?
for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
        echo "demo: the ${names[$i]} stopped; its log, $LOGS/${names[$i]}.log:" >&2
        tail -n 30 "$LOGS/${names[$i]}.log" >&2
    fi
done
exit $((status == 0 ? 1 : status))

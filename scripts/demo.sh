#!/usr/bin/env bash
# The demo: the example project on SQLite with a worker, traffic and the dashboard.
# Ctrl-C stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-.venv/bin/python}"
HOST="${DEMO_HOST:-127.0.0.1}"
PORT="${DEMO_PORT:-8000}"
USERNAME="${DEMO_USERNAME:-admin}"
PASSWORD="${DEMO_PASSWORD:-admin}"
export DJANGO_SETTINGS_MODULE=example_project.settings
export PYTHONUNBUFFERED=1

"$PY" manage.py migrate --noinput -v 0
DEMO_USERNAME="$USERNAME" DEMO_PASSWORD="$PASSWORD" "$PY" manage.py shell -c "
import os
from django.contrib.auth import get_user_model
user, _ = get_user_model().objects.get_or_create(username=os.environ['DEMO_USERNAME'])
user.is_staff = user.is_superuser = True
user.set_password(os.environ['DEMO_PASSWORD'])
user.save()
"
"$PY" manage.py durable_traffic --seed 1 > /dev/null

pids=()
stop() {
    trap - INT TERM EXIT
    echo
    echo "stopping the worker, the traffic and the web server..."
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap stop INT TERM EXIT

"$PY" manage.py durable_worker --concurrency 4 &
pids+=($!)
"$PY" manage.py durable_traffic --forever --every 20 > /dev/null &
pids+=($!)
"$PY" manage.py runserver "$HOST:$PORT" --noreload &
pids+=($!)

sleep 2
cat <<INFO

  django-durable demo
  Dashboard: http://$HOST:$PORT/admin/durable/
  Login:     $USERNAME / $PASSWORD
  (the worker runs the workflows; new traffic arrives every 20 seconds)
  Press Ctrl-C to stop.

INFO
wait -n "${pids[@]}" || true

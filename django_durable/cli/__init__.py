"""``python manage.py durable <command>``: the command line for the people on call.

The management command only parses and dispatches; each module here adds the
subcommands of one group (``runs``, ``keys``, ``queues``, ``doctor``) and turns
their answers into tables for people or JSON for scripts. Everything goes
through the public API, so the command line can do nothing the API can't.

Exit status: 0 on success, 1 when the operation is refused (the reason on stderr),
2 on bad usage.
"""

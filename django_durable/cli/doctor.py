"""``durable doctor``: every check of ``django_durable.health``, each problem with its fix."""

from __future__ import annotations

from django_durable import health
from django_durable.cli.base import emit_json, refused


def add_parsers(commands) -> None:
    p = commands.add_parser(
        "doctor", help="check migrations, workers and their workflows, NOTIFY, clock, pool, runs"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=doctor)


def doctor(options, out, err) -> None:
    findings = health.checks()
    problems = [f for f in findings if f.problem]
    if options["json"]:
        emit_json(out, [f.as_dict() for f in findings])
    else:
        for finding in findings:
            mark = "PROBLEM" if finding.problem else "ok"
            out.write(f"{mark:<8} {finding.check:<11} {finding.detail}")
            if finding.fix:
                out.write(f"{'':<8} {'':<11} fix: {finding.fix}")
    if problems:
        raise refused(f"{len(problems)} problem(s) found")

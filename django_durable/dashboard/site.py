"""How every dashboard page is served: through the admin site that registered runs.

``RunAdmin.dashboard_urls()`` wraps each view with ``guard()``: the admin site's
own ``admin_view`` (its login page, staff check, ``never_cache``, CSRF), the
``view_run`` permission, headers that forbid framing, and an answer to htmx
polls whose session ran out that sends the browser to the login page instead of
swapping the login form into a table. Views get the ``RunAdmin`` to render with
its site's ``each_context`` (chrome, sidebar, user links).
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Any

from django.contrib.auth import REDIRECT_FIELD_NAME
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.safestring import mark_safe

from django_durable.operations.calls import not_migrated

REFRESH_SECONDS = 5
CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="[^"]*"')
FRAME_HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
}


def is_htmx(request: HttpRequest) -> bool:
    """An htmx request, read from its header: works with or without HtmxMiddleware
    (the check ``django_durable.E012`` asks for it, the pages never need it)."""
    return request.headers.get("HX-Request") == "true"


def forbid_framing(response: HttpResponse) -> HttpResponse:
    for name, value in FRAME_HEADERS.items():
        response[name] = value
    return response


def refused(request: HttpRequest, run_admin, message: str, status: int = 403) -> HttpResponse:
    """A refusal inside the admin's chrome, saying what permission is missing."""
    context = {
        **run_admin.admin_site.each_context(request),
        "title": "Not allowed",
        "message": message,
    }
    return render(request, "django_durable/refused.html", context, status=status)


def guard(view, run_admin, *, perm: str = "view"):
    """``view(request, run_admin, ...)`` served by ``run_admin``'s site, for users
    with ``view_run`` (``perm="change"``: ``change_run``)."""
    site = run_admin.admin_site

    def checked(request, *args, **kwargs):
        request.current_app = site.name
        if not can(request, run_admin, perm):
            needed = f"django_durable.{perm}_run"
            return refused(request, run_admin, f"This needs the {needed} permission.")
        if (problem := not_migrated()) is not None:  # a page that says so, not a 500
            context = {**run_admin.admin_site.each_context(request), "title": "Run migrate"}
            context["message"] = str(problem)
            return render(request, "django_durable/not_migrated.html", context, status=503)
        return view(request, run_admin, *args, **kwargs)

    protected = site.admin_view(checked)

    @functools.wraps(view)
    def served(request, *args, **kwargs):
        if is_htmx(request) and not site.has_permission(request):
            return forbid_framing(login_redirect_for_htmx(request, site))
        return forbid_framing(protected(request, *args, **kwargs))

    return served


def can(request: HttpRequest, run_admin, perm: str) -> bool:
    if perm == "view":
        return run_admin.has_view_permission(request)
    return request.user.has_perm("django_durable.change_run")


def login_redirect_for_htmx(request: HttpRequest, site) -> HttpResponse:
    """htmx follows ``HX-Redirect`` with a full page load: the poll of an expired
    session ends on the login page, coming back to the page afterwards."""
    page = request.headers.get("HX-Current-URL") or request.get_full_path()
    login = reverse("admin:login", current_app=site.name)
    response = HttpResponse(status=204)
    response["HX-Redirect"] = f"{login}?{urlencode({REDIRECT_FIELD_NAME: _path_of(page)})}"
    return response


def _path_of(url: str) -> str:
    """The path and query of the page's URL (never another host)."""
    if "://" in url:
        url = "/" + url.split("://", 1)[1].partition("/")[2]
    return url if url.startswith("/") else "/"


def render_page(
    request: HttpRequest,
    run_admin,
    template: str,
    title: str,
    context: dict[str, Any],
    *,
    live: str | None = None,
) -> HttpResponse:
    """The full page, or for an htmx poll only its ``live`` partial.

    The partial is rendered first and fingerprinted; a poll that already shows
    this fingerprint gets 204 and htmx swaps nothing, so opened ``<details>``,
    scroll position and selected text stay until something really changed.
    """
    context = {
        **run_admin.admin_site.each_context(request),
        "title": title,
        "refresh_seconds": REFRESH_SECONDS,
        "can_change": can(request, run_admin, "change"),
        "poll_url": without(request, "_seen", "_status"),
        **context,
    }
    if live is not None:
        html = render_to_string(live, context, request)
        # A CSRF token is masked afresh at every render: not a change.
        steady = CSRF_FIELD.sub("", html)
        fingerprint = hashlib.sha256(steady.encode()).hexdigest()[:20]
        if is_htmx(request):
            if request.GET.get("_seen") == fingerprint:
                return HttpResponse(status=204)
            context.update(live_html=mark_safe(html), fingerprint=fingerprint)  # noqa: S308
            return render(request, "django_durable/_poll.html", context)
        context.update(live_html=mark_safe(html), fingerprint=fingerprint)  # noqa: S308
    return render(request, template, context)


def without(request: HttpRequest, *names: str) -> str:
    """The request's path and query without the named parameters."""
    params = request.GET.copy()
    for name in names:
        params.pop(name, None)
    query = params.urlencode()
    return f"{request.path}?{query}" if query else request.path

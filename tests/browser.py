"""Shared by the browser tests: one Chromium per test module, screenshots, login."""

import os
import re
from pathlib import Path

import pytest
from playwright import sync_api

CHROMIUM = os.environ.get("DURABLE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PASSWORD = "correct horse battery staple"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def chromium():
    # Playwright's sync API runs an event loop in this thread; the test's own ORM
    # calls are ordinary synchronous code between browser steps.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def staff(django_user_model):
    """A superuser who signs in with PASSWORD."""
    return django_user_model.objects.create_superuser("staff", "staff@example.com", PASSWORD)


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("DURABLE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def login(browser, live_server, username: str, *, width: int = 1280, height: int = 900):
    """A new browser context signed in as ``username`` (whose password is PASSWORD)."""
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/durable/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/durable/$"))
    return context, page

"""A real browser on the live farm's admin: Playwright driving Debian's Chromium (headless).

Chromium comes from the system (`apt-get install chromium`, which `.ci/run` does), never from
`playwright install`. Without it the browser tests fail, loudly, naming the fix.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.livefarm import REPO, LiveFarm

CHROMIUM = os.environ.get("INLINE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
WINDOW = {"width": 1400, "height": 900}
# Screenshots land here (ignored by git); CI keeps the folder as the run's artefacts.
SCREENSHOTS = Path(os.environ.get("INLINE_TEST_OUTPUT", REPO / "test-output")) / "admin-browser"
LEAD = ("browser-lead", "a-long-test-password-1")


@pytest.fixture(scope="module")
def chromium_context(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch
) -> Iterator[Any]:
    """A fresh Chromium profile at 1400×900; fails (never skips) when Chromium is missing."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no Chromium at {CHROMIUM}: the admin browser tests need it. Install it "
                    "with `apt-get install -y chromium` (.ci/run does) or point "
                    "INLINE_TEST_CHROMIUM at one.", pytrace=False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the `playwright` package is missing: pip install -e '.[dev]'", pytrace=False)
    # Playwright's sync API runs an event loop in this thread; Django then refuses ORM calls
    # ("async context") although they are plain sync code here. Only while the browser runs.
    monkeypatch_module.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM,
            headless=True, args=CHROMIUM_ARGS,
            viewport={"width": WINDOW["width"], "height": WINDOW["height"]},
        )
        try:
            yield context
        finally:
            context.close()
            # With Playwright's loop running, Django kept its connections in a separate (async)
            # store: close them here, or the test database cannot be dropped at the end.
            from django.db import connections

            connections.close_all()


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="session")
def lead_login(django_db_blocker: Any) -> tuple[str, str]:
    """A staff superuser with a password, committed where the live farm's web process reads."""
    from django.contrib.auth import get_user_model

    with django_db_blocker.unblock():
        users = get_user_model().objects
        if not users.filter(username=LEAD[0]).exists():
            users.create_superuser(LEAD[0], "lead@studio.test", LEAD[1])
    return LEAD


@pytest.fixture(scope="module")
def admin(farm: LiveFarm, chromium_context: Any, lead_login: tuple[str, str]) -> Iterator[Any]:
    """A browser page logged in to the live farm's admin as the lead."""
    page = chromium_context.new_page()
    page.goto(f"{farm.url}/admin/login/")
    page.fill("#id_username", lead_login[0])
    page.fill("#id_password", lead_login[1])
    page.click("input[type=submit]")
    page.wait_for_url(f"{farm.url}/admin/")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    yield page
    page.close()

"""The tests purge only a broker that is theirs (tests/brokerguard.py)."""

from __future__ import annotations

import pytest

from tests.brokerguard import broker_refusal


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0",  # the settings' default: a developer's or a real farm's broker
    "redis://127.0.0.1:6379",
    "redis://:secret@farm-broker:6379/3",
    "amqp://guest:guest@localhost:5672//",
])
def test_a_broker_that_is_not_the_tests_own_is_refused(url, monkeypatch):
    monkeypatch.delenv("INLINE_TEST_BROKER", raising=False)
    reason = broker_refusal(url)
    assert reason is not None and "INLINE_TEST_BROKER" in reason
    assert "secret" not in reason


def test_the_dedicated_test_database_and_a_declared_scratch_broker_are_accepted(monkeypatch):
    monkeypatch.delenv("INLINE_TEST_BROKER", raising=False)
    assert broker_refusal("redis://127.0.0.1:6379/10") is None  # what .ci/run uses
    monkeypatch.setenv("INLINE_TEST_BROKER", "amqp://guest:guest@localhost:5672/tests")
    assert broker_refusal("amqp://guest:guest@localhost:5672/tests") is None
    assert broker_refusal("amqp://guest:guest@localhost:5672//") is not None


def test_the_broker_this_suite_runs_on_is_its_own():
    """`./farm test` starts an embedded Redis in an inline-farm-test- temp dir, .ci/run uses
    db 10: either way the guard lets the suite purge it, and only it."""
    from django.conf import settings

    assert broker_refusal(settings.BROKER_URL) is None

"""semjobs.db.retry: a unit of database work survives a short outage, gives up after a long one."""

import logging

import pytest
from sqlalchemy.exc import OperationalError

from semjobs.db.retry import one_line, retrying


class FakeSession:
    rollbacks = 0

    def rollback(self):
        self.rollbacks += 1


def flaky(failures: int):
    calls = []

    def work():
        calls.append(1)
        if len(calls) <= failures:
            raise OperationalError("INSERT", {}, Exception("connection refused\nmore detail"))
        return "stored"

    return work, calls


def test_work_is_retried_through_an_outage_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr("semjobs.db.retry.time.sleep", lambda s: None)
    session, (work, calls) = FakeSession(), flaky(3)
    with caplog.at_level(logging.WARNING, logger="semjobs.db.retry"):
        assert retrying(session, work, "storing a result") == "stored"
    assert len(calls) == 4 and session.rollbacks == 3
    assert [r.message.split(",")[0] for r in caplog.records] == [
        "database unreachable while storing a result", "database answers again after 3 retries (storing a result)"]


def test_an_outage_longer_than_the_limit_raises(monkeypatch):
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "database_retry_s", 0.0)
    work, calls = flaky(10)
    with pytest.raises(OperationalError):
        retrying(FakeSession(), work, "claiming an item")
    assert len(calls) == 1


def test_other_errors_are_not_retried():
    def work():
        raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError):
        retrying(FakeSession(), work, "x")


def test_one_line_names_the_type_and_the_first_line():
    e = OperationalError("SELECT 1", {}, Exception("connection refused\nIs the server running?"))
    assert one_line(e) == "OperationalError: connection refused"

"""``send_on_commit`` is at-most-once between the commit and the publish (README, "What is
not promised"; the outbox, ``outbox=True``, closes it). This pins the documented behaviour down, so
the README line stays true: the rows are committed, the message is not sent, the error comes
out of the commit, and later ``on_commit`` callbacks of that transaction do not run."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings

from django_rmq_retry import PublishError
from django_rmq_retry.models import RetryPolicy
from django_rmq_retry.publishing.per_thread import reset_publisher
from tests.testapp.events import other

UNREACHABLE = "amqp://guest:guest@127.0.0.1:1/%2F"


@pytest.mark.django_db(transaction=True)
def test_a_broker_down_at_commit_time_raises_after_the_rows_are_committed():
    conf = {**settings.RMQ_RETRY, "BROKER_URL": UNREACHABLE, "CONNECT_TIMEOUT": 2}
    later: list[str] = []
    with override_settings(RMQ_RETRY=conf):
        reset_publisher()
        try:
            with pytest.raises(PublishError), transaction.atomic():
                RetryPolicy.objects.create(receiver="billing.consumers.send_invoice")
                other.send_on_commit({"id": 1})
                transaction.on_commit(lambda: later.append("ran"))
        finally:
            reset_publisher()
    assert RetryPolicy.objects.filter(receiver="billing.consumers.send_invoice").exists()
    assert later == []

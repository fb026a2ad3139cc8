"""The held keys' admin: each held key with its blocker, why it holds, and the messages
held behind it in the order they will run; view-only."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_rmq_retry.models import HeldMessage, KeyHold

pytestmark = pytest.mark.django_db


def test_a_held_key_shows_its_blocker_and_its_messages_in_order(client: Client) -> None:
    User.objects.create_superuser("op", "op@example.com", "pw")
    client.login(username="op", password="pw")
    now = timezone.now()
    hold = KeyHold.objects.create(
        receiver="shop.receivers.apply",
        key="acct-7",
        queue="p.shop.receivers.apply.p01",
        state="parked",
        blocker="m-1",
        parked_id=41,
        since=now,
        changed_at=now,
    )
    for n in (2, 3):
        HeldMessage.objects.create(
            hold=hold,
            message_id=f"m-{n}",
            body=b'{"account": "acct-7", "n": %d}' % n,
            properties={"content_type": "application/json"},
            held_at=now,
        )
    listing = client.get(reverse("admin:django_rmq_retry_keyhold_changelist"))
    assert listing.status_code == 200
    assert b"acct-7" in listing.content and b"m-1" in listing.content
    page = client.get(reverse("admin:django_rmq_retry_keyhold_change", args=[hold.pk]))
    text = page.content.decode()
    assert page.status_code == 200
    assert "held behind message m-1 of key &#x27;acct-7&#x27;, which is parked" in text
    assert text.index("m-2") < text.index("m-3")
    assert "&quot;n&quot;: 2" in text or '"n": 2' in text
    add: Any = client.get(reverse("admin:django_rmq_retry_keyhold_add"))
    assert add.status_code == 403

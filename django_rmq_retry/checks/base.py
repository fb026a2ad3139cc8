"""What every system check of ours shares: the id prefix, the tag, the error builder."""

from __future__ import annotations

from django.core import checks

ID = "django_rmq_retry"
#: Our checks' tag (not Django's ``compatibility``, which means Django upgrade notes).
TAG = "django_rmq_retry"

Messages = list[checks.CheckMessage]


def _err(n: int, msg: str, hint: str) -> checks.Error:
    return checks.Error(msg, hint=hint, id=f"{ID}.E{n:03d}")

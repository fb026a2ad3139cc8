"""A logging filter giving a receiver's own log records the message's fields.

Our log records about a message carry ``receiver``, ``message_id``, ``attempt``, ``queue``
and ``trace_id`` as ``extra`` already. Records your receivers log get them from this
filter, added to a handler in your ``LOGGING`` (docs/howto/observability.md)::

    "filters": {"rmq_message": {"()": "django_rmq_retry.observability.logs.MessageFields"}},

``MessageFields(defaults=True)`` also gives every other record the fields (as ``None``) so a
text format such as ``%(receiver)s`` never fails on them. Standard library only.
"""

from __future__ import annotations

import logging

from ..core.logfields import FIELDS, current_message, message_fields


class MessageFields(logging.Filter):
    def __init__(self, name: str = "", defaults: bool = False) -> None:
        super().__init__(name)
        self.defaults = defaults

    def filter(self, record: logging.LogRecord) -> bool:
        message = current_message.get()
        if message is not None:
            for key, value in message_fields(message).items():
                if not hasattr(record, key):
                    setattr(record, key, value)
        elif self.defaults:
            for key in FIELDS:
                if not hasattr(record, key):
                    setattr(record, key, None)
        return True

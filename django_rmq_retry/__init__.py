"""django-rmq-retry: safe RabbitMQ consumers for Django.

Public API::

    from django_rmq_retry import Topic, receiver, Message, Policy, Retry, Reject
    from django_rmq_retry import ValidationError, upcaster   # typed topics
"""

from .core.backoff import Policy
from .core.errors import (
    BrokerUnavailable,
    MessageRefused,
    NackedError,
    PublishError,
    Reject,
    Retry,
    TopologyError,
    UnroutableError,
    ValidationError,
)
from .core.message import Message
from .registry import Receiver, receiver
from .schemas.upcasting import upcaster
from .topics import Topic

__all__ = [
    "BrokerUnavailable",
    "Message",
    "MessageRefused",
    "NackedError",
    "Policy",
    "PublishError",
    "Receiver",
    "Reject",
    "Retry",
    "Topic",
    "TopologyError",
    "UnroutableError",
    "ValidationError",
    "receiver",
    "upcaster",
]
__version__ = "1.0.0a1"

"""django-rmq-retry: safe RabbitMQ consumers for Django.

Public API::

    from django_rmq_retry import Topic, receiver, Message, Policy, Retry, Reject
"""

from .backoff import Policy
from .errors import BrokerUnavailable, PublishError, Reject, Retry, TopologyError, UnroutableError
from .message import Message
from .topics import Receiver, Topic, receiver

__all__ = [
    "BrokerUnavailable",
    "Message",
    "Policy",
    "PublishError",
    "Receiver",
    "Reject",
    "Retry",
    "Topic",
    "TopologyError",
    "UnroutableError",
    "receiver",
]
__version__ = "0.1.0"

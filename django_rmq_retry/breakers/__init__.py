"""Dependency breakers shared by every consumer process (``RMQ_RETRY["DEPENDENCIES"]``).

``core.breaker`` decides each step; ``state`` reads and writes the rows; ``announce`` says
what changed; the consumer's gate and watch (``consumer``) act on them.
"""

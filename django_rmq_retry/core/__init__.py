"""The pure core: every decision the library makes, with the standard library only.

Nothing here imports Django or pika, so each decision (retry or park, where a retry goes and
when, what an incoming delivery says about itself, how a body decodes) is a function of
plain values, tested without a broker or a database. ``tests/test_layers`` (import-linter)
keeps it that way.
"""

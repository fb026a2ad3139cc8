"""``manage.py bench_consume``: ``rmq_consume`` running the PROPOSED consumer changes.

Bench-only: it swaps in :class:`bench.proposed_consumer.BatchingConsumer` so the benchmark
can measure the hot-path changes proposed in the report against the shipped consumer,
in the same run. Same options as ``rmq_consume``.
"""

from django_rmq_retry.management.commands.rmq_consume import Command as RmqConsume


class Command(RmqConsume):
    help = "rmq_consume with the proposed (unshipped) hot-path changes, for benchmarks."

    def handle(self, *args, **options):
        import django_rmq_retry.consumer as consumer_module
        from bench.proposed_consumer import BatchingConsumer

        consumer_module.Consumer = BatchingConsumer
        return super().handle(*args, **options)

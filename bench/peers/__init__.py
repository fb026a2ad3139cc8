"""The peers group of the benchmarks (issue #14): Dramatiq and Celery doing the same work as
our consumer, on the same broker, in the same run, beside the same raw-pika twin.

Optional: ``pip install --group peers``. ``bench/run.py peers`` runs it (``scenario.py``);
without the peers installed it prints one "skipped" row. ``dramatiq_side.py`` and
``celery_side.py`` are the peers' worker processes (and the publishers the benchmark uses
to fill their queues); ``record.py`` is the bookkeeping every worker shares.
"""

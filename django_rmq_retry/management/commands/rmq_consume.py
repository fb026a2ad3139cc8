"""``manage.py rmq_consume``: run the consumer (the loop itself lives in consumer.py)."""

from __future__ import annotations

import gc
import logging
import os
import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_rmq_retry import broker
from django_rmq_retry.conf import (
    app_settings,
    broker_urls,
    current_names,
    current_plan,
)
from django_rmq_retry.consumer import Consumer
from django_rmq_retry.core.errors import BrokerUnavailable, TopologyError
from django_rmq_retry.core.spread import Share
from django_rmq_retry.db.tables import missing_tables_message, never_migrated
from django_rmq_retry.hooks import CHILD_DIR_ENV
from django_rmq_retry.management import arguments, listing, orphans
from django_rmq_retry.management.arguments import refuse_overlapping_order, select_receivers
from django_rmq_retry.management.helptext import from_setting
from django_rmq_retry.management.stop_signals import on_stop_signals
from django_rmq_retry.registry import Receiver
from django_rmq_retry.registry.policies import policy_cache


class Command(BaseCommand):
    help = (
        "Consume the queues of the given receivers (all by default), retrying and parking failures."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "receivers",
            nargs="*",
            help="Receiver dotted paths or queue names (default: every registered receiver).",
        )
        parser.add_argument(
            "--list",
            action="store_true",
            help="Show receivers, queues, bindings and the retry topology, then exit.",
        )
        parser.add_argument(
            "--prefetch",
            type=int,
            help=f"Unacked deliveries held at once {from_setting('PREFETCH')}.",
        )
        parser.add_argument(
            "--threads", type=int, help=f"Receiver threads {from_setting('THREADS')}."
        )
        parser.add_argument(
            "--max-messages",
            type=int,
            help="Stop after this many messages were handled, retried or parked "
            "(default: no limit).",
        )
        parser.add_argument(
            "--max-idle-time",
            type=float,
            help="Stop after this many seconds without a message (default: never, run until "
            "stopped).",
        )
        parser.add_argument(
            "--fail-fast",
            action="store_true",
            help="Exit with an error if the broker cannot be reached at start (default: keep retrying).",
        )
        parser.add_argument(
            "--setup-only",
            action="store_true",
            help="Declare the topology, remember the receivers' queues (a queue left behind by "
            "a renamed receiver is told from them) and exit.",
        )
        parser.add_argument(
            "--no-orphans",
            action="store_true",
            help="Do not consume the parking queues (retry copies whose receiver queue is "
            "gone; with quorum queues, what the broker dead-lettered).",
        )
        parser.add_argument(
            "--no-relay",
            action="store_true",
            help="Do not run the outbox relay (and the inbox purge) in this consumer.",
        )
        parser.add_argument(
            "--processes",
            type=int,
            default=1,
            help="Run this many consumer processes under a supervisor that restarts any that "
            "dies and forwards SIGTERM/SIGINT (default: 1, no supervisor). --max-messages "
            "then applies to each process. Child i of N takes the ordered receivers' "
            "partitions p %% N == i first (it gets DJANGO_RMQ_RETRY_PROCESS=i/N).",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            help="Serve Prometheus metrics (/metrics) and health probes (/healthz/live, "
            f"/healthz/ready) on this port {from_setting('METRICS_PORT')}; needs the "
            "'prometheus' extra. With --processes, the supervisor serves every process's sums.",
        )
        parser.add_argument(
            "--health-dir",
            help="Touch DIR/live while the I/O loop turns and keep DIR/ready while consuming "
            f"every queue, for exec probes {from_setting('HEALTH_DIR')}.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        receivers = select_receivers(options["receivers"])
        if options["list"]:
            listing.write(self.stdout, self.style, receivers)
            return
        if not receivers and not options["setup_only"]:
            raise CommandError(
                "No receivers are registered. Declare them with @receiver(topic) in a "
                f"'{app_settings.DISCOVER_MODULE}.py' module of an app listed in INSTALLED_APPS."
            )
        if options["setup_only"]:
            self._setup(receivers)
            return
        if options["processes"] < 1:
            raise CommandError("--processes must be at least 1.")
        refuse_overlapping_order(receivers, int(options["threads"] or app_settings.THREADS))
        share = arguments.process_share()  # its place among peers: which partitions first
        if options["metrics_port"] is None:
            options["metrics_port"] = app_settings.METRICS_PORT
        if options["health_dir"] is None:
            options["health_dir"] = app_settings.HEALTH_DIR
        missing = missing_tables_message()
        if missing and never_migrated():  # nothing it writes could be written: not started
            raise CommandError(
                f"{missing} The consumer needs them to park failures, relay the outbox and "
                "count deliveries; it consumes nothing until then."
            )
        if missing:  # an upgrade's new tables: what succeeds is acked, what fails waits
            self.stderr.write(
                f"{missing} Until then a message that fails for good may not be parked: it "
                "stays unacked on the broker (not lost)."
            )
        if options["processes"] > 1:
            self._supervise(options, share)
            return
        observer, server = self._observe(options)
        consumer = Consumer(
            receivers,
            prefetch=options["prefetch"],
            threads=options["threads"],
            max_messages=options["max_messages"],
            max_idle_time=options["max_idle_time"],
            fail_fast=options["fail_fast"],
            consume_orphans=not options["no_orphans"],
            relay=not options["no_relay"],
            share=share,
        )
        self._announce(consumer, receivers, options)
        restore = self._install_signal_handlers(consumer, options["verbosity"])
        policy_cache.invalidate()
        orphans.warn_at_start(receivers)  # logs each queue no receiver owns (never deletes)
        # What is alive now (Django, the apps, the receivers' modules) lives as long as the
        # process: frozen, the cyclic collector stops walking it. Unfrozen, every collection
        # walks it, and a full one stalls every thread mid-stream (see bench/README.md).
        gc.collect()
        gc.freeze()
        try:
            stats = consumer.run()
        except (BrokerUnavailable, TopologyError) as exc:
            raise CommandError(str(exc)) from None
        finally:
            gc.unfreeze()  # called in a process that goes on (call_command): as it was
            restore()
            if observer is not None:
                self._unobserve(observer, server)
        self.stdout.write(
            self.style.SUCCESS(
                f"Stopped: {stats.handled} handled, {stats.retried} retried, {stats.parked} parked, "
                f"{stats.released} released, {stats.reconnects} reconnect(s)."
            )
        )

    def _supervise(self, options: dict[str, Any], share: Share | None) -> None:
        from django.conf import settings

        from django_rmq_retry.management import supervisor

        args: list[str] = list(options["receivers"])
        for name in ("prefetch", "threads", "max_messages", "max_idle_time"):
            if options[name] is not None:
                args += [f"--{name.replace('_', '-')}", str(options[name])]
        for name in ("fail_fast", "no_orphans", "no_relay"):
            if options[name]:
                args.append(f"--{name.replace('_', '-')}")
        args += ["--verbosity", str(options["verbosity"])]
        for name in ("settings", "pythonpath"):  # Django's own options, as the parent got them
            if options.get(name):
                args += [f"--{name}", str(options[name])]
        if options.get("no_color"):
            args.append("--no-color")
        entry = supervisor.entry_point()
        env = supervisor.child_environment(project_root=entry is None)
        port, health_dir = options["metrics_port"], options["health_dir"]
        directory = None
        if port is not None or health_dir:
            # The environment's PROMETHEUS_MULTIPROC_DIR is kept after the run; ours is not.
            options["_kept_directory"] = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
            directory = self._children_directory(env, metrics=port is not None)
            if port is not None:
                args += ["--metrics-port", str(port)]  # the children count, we serve
        sup = supervisor.Supervisor(
            supervisor.consumer_command(args, settings.SETTINGS_MODULE, entry=entry),
            options["processes"],
            env=env,
            share=share or Share(0, 1),  # each child's index: the partitions it takes first
        )
        server = None
        if directory is not None:
            server = self._observe_children(directory, sup.pids, port, health_dir)
        processes = _count(options["processes"], "consumer process", "consumer processes")
        if options["verbosity"] >= 1:
            self.stdout.write(
                f"Starting {processes} (each says what it consumes); a process that dies is "
                "started again. Ctrl-C or SIGTERM stops them warm; a second one exits at once."
            )

        def notice(signum: int, count: int) -> None:
            name = signal.Signals(signum).name
            if count == 1 and options["verbosity"] >= 1:
                _say(
                    self.stdout,
                    f"{name}: asked the {processes} to stop warm (each finishes its running "
                    "messages, at most SHUTDOWN_TIMEOUT). Press Ctrl-C again (or send "
                    f"{name} again) to make them exit now.",
                )
            elif count == 2:
                _say(self.stderr, f"Second {name}: the consumer processes exit now.")

        restore = sup.install_signal_handlers(notice)
        try:
            code = sup.run()
        finally:
            restore()
            if server is not None:
                server.shutdown()
                server.server_close()
            if directory is not None and not options.get("_kept_directory"):
                import shutil

                shutil.rmtree(directory, ignore_errors=True)  # ours: a fresh temporary one
        if code:
            raise CommandError("a consumer process exited with an error (see the log above).")
        self.stdout.write(
            self.style.SUCCESS(f"Stopped: all {options['processes']} consumer processes exited.")
        )

    # Observability -----------------------------------------------------------------------------
    def _observe(self, options: dict[str, Any]) -> tuple[Any, Any]:
        """Install the observability hooks (before the consumer is built: it reads them)
        and start the endpoint. Nothing is imported when every part is off."""
        port, health_dir = options["metrics_port"], options["health_dir"]
        child = bool(os.environ.get(CHILD_DIR_ENV))
        tracing = bool(app_settings.TRACING)
        if port is None and not health_dir and not tracing and not child:
            return None, None
        from django_rmq_retry import observability

        for wanted, module, extra in (
            (port is not None, "prometheus_client", "prometheus"),
            (tracing, "opentelemetry", "otel"),
        ):
            problem = observability.missing_extra(module, extra) if wanted else None
            if problem:
                raise CommandError(problem)
        observer = observability.enable(
            metrics=port is not None,
            tracing=tracing,
            liveness_timeout=float(app_settings.LIVENESS_TIMEOUT),
            health_dir=None if child else health_dir,
        )
        server = None
        if port is not None and not child:
            try:
                server = observability.serve_consumer(
                    observer, str(app_settings.METRICS_ADDRESS), port
                )
            except OSError as exc:
                observability.disable()
                raise CommandError(f"cannot serve metrics on port {port}: {exc}") from None
        return observer, server

    def _unobserve(self, observer: Any, server: Any) -> None:
        from django_rmq_retry import observability

        observer.stopped()
        observability.disable()
        if server is not None:
            server.shutdown()
            server.server_close()

    def _children_directory(self, env: dict[str, str], *, metrics: bool) -> str:
        if metrics:
            from django_rmq_retry import observability

            problem = observability.missing_extra("prometheus_client", "prometheus")
            if problem:
                raise CommandError(problem)
            from django_rmq_retry.observability.multiprocess import ENV, prepare_directory

            directory = prepare_directory()
            env[ENV] = directory
        else:
            import tempfile

            directory = tempfile.mkdtemp(prefix="django-rmq-retry-health-")
        env[CHILD_DIR_ENV] = directory
        return directory

    def _observe_children(
        self, directory: str, pids: Any, port: int | None, health_dir: str | None
    ) -> Any:
        from django_rmq_retry import observability
        from django_rmq_retry.observability.health import ChildrenHealth, FileReporter

        timeout = float(app_settings.LIVENESS_TIMEOUT)
        if health_dir:
            FileReporter(ChildrenHealth(directory, pids, timeout), health_dir)
        if port is None:
            return None
        try:
            return observability.serve_supervisor(
                directory, pids, str(app_settings.METRICS_ADDRESS), port, timeout
            )
        except OSError as exc:
            raise CommandError(f"cannot serve metrics on port {port}: {exc}") from None

    # Helpers -----------------------------------------------------------------------------------

    def _setup(self, receivers: list[Receiver]) -> None:
        try:
            conn = broker.connect()
        except BrokerUnavailable as exc:
            raise CommandError(str(exc)) from None
        try:
            conn.channel().declare(current_plan(receivers))
        except TopologyError as exc:
            raise CommandError(str(exc)) from None
        finally:
            conn.close()
        # Remembered as rmq_setup does: a receiver renamed later leaves this queue behind,
        # and only a remembered queue is reported as an orphan (management/orphans.py).
        try:
            orphans.record(receivers)
        except DatabaseError as exc:
            self.stderr.write(
                f"The declared queues were not recorded ({exc}): a receiver renamed later "
                "will not have its old queue reported as an orphan. Run `manage.py migrate "
                "django_rmq_retry`, then this again."
            )
        self.stdout.write(
            self.style.SUCCESS(f"Topology declared for {len(receivers)} receiver(s).")
        )

    def _announce(
        self, consumer: Consumer, receivers: list[Receiver], options: dict[str, Any]
    ) -> None:
        """Say at start what this process consumes, where, and how to stop it (at the
        default verbosity: a consumer that prints nothing looks hung)."""
        if options["verbosity"] < 1:
            return
        prefix = current_names().prefix
        parking = current_plan(receivers).parking_queues if not options["no_orphans"] else []
        urls = ", ".join(broker.mask_url(u) for u in broker_urls())
        self.stdout.write(
            f"Consuming {len(receivers) + len(parking)} queue(s) on {urls} "
            f"(prefetch {consumer.prefetch}, {_count(consumer.threads, 'thread')}, "
            f"{_count(options['processes'], 'process', 'processes')}):"
        )
        for rec in receivers:
            queue = f" [queue {rec.queue_name(prefix)}]" if options["verbosity"] > 1 else ""
            self.stdout.write(f"  {rec.name} <- {', '.join(rec.routing_keys)}{queue}")
        for queue in parking:
            self.stdout.write(f"  {queue} (messages the broker gave up on: parked)")
        self.stdout.write(
            "Ctrl-C or SIGTERM stops after the running messages finish; a second one exits at once."
        )

    def _install_signal_handlers(self, consumer: Consumer, verbosity: int) -> Any:
        received: list[int] = []
        log = logging.getLogger("django_rmq_retry.consumer")

        def handler(signum: int) -> None:
            received.append(signum)
            name = signal.Signals(signum).name
            if len(received) == 1:
                consumer.request_stop()  # warm: finish in-flight work, then exit 0
                if verbosity >= 1:
                    _say(
                        self.stdout,
                        _stop_notice(name, consumer.running(), consumer.shutdown_timeout),
                    )
            else:
                _say(
                    self.stderr, f"Second {name}: exiting now; unfinished messages are redelivered."
                )
                log.critical("second %s: cold exit; unacked messages return to their queues", name)
                os._exit(128 + signum)

        return on_stop_signals(handler)


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _stop_notice(signame: str, running: int, timeout: float) -> str:
    """What the first SIGTERM/SIGINT waits for, and how not to wait."""
    if running:
        waits = (
            f"waiting for {_count(running, 'running message')} to finish (at most {timeout:g} s, "
            "SHUTDOWN_TIMEOUT); messages not started go back to their queues"
        )
    else:
        waits = "no message is running; messages not started go back to their queues"
    return (
        f"{signame}: stopping, {waits}. Press Ctrl-C again (or send {signame} again) to exit now."
    )


def _say(out: Any, text: str) -> None:
    """Write from a signal handler: never let a write it interrupted turn into a crash."""
    try:
        out.write(text)
        out.flush()
    except (RuntimeError, OSError, ValueError):  # reentrant write, closed stream
        pass

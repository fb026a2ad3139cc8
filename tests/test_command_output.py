"""What the management commands print, and what they leave alone (the project's logging)."""

from __future__ import annotations

import io
import logging
import signal
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import OutputWrapper

from django_rmq_retry.management.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# The project owns logging -------------------------------------------------------------------
@pytest.fixture
def project_logging():
    """The app's logger as a project's LOGGING left it; what a command changed is restored
    after the test (and reported by it)."""
    logger = logging.getLogger("django_rmq_retry")
    old_level, old_handlers = logger.level, list(logger.handlers)
    logger.setLevel(logging.ERROR)
    yield logger
    logger.setLevel(old_level)
    logger.handlers[:] = old_handlers


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("verbosity", [0, 3])
def test_rmq_consume_leaves_the_projects_loggers_alone(rmq, project_logging, verbosity):
    handlers = list(project_logging.handlers)
    call_command(
        "rmq_consume", "gamma", max_idle_time=0.2, verbosity=verbosity, stdout=io.StringIO()
    )
    assert project_logging.level == logging.ERROR  # -v 3 set DEBUG, -v 0 ERROR before
    assert project_logging.handlers == handlers
    assert logging.getLogger("django_rmq_retry.consumer").level == logging.NOTSET


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_rmq_relay_leaves_the_projects_loggers_alone(rmq, project_logging):
    call_command("rmq_relay", once=True, verbosity=2, stdout=io.StringIO())
    assert project_logging.level == logging.ERROR  # was forced to INFO at -v 2


# Progress -----------------------------------------------------------------------------------
def test_progress_redraws_in_place_on_a_terminal():
    term, clock = Terminal(), Clock()
    bar = Progress(OutputWrapper(term), 1000, label="requeue", clock=clock)
    for done in range(0, 1001, 100):
        clock.now += 0.2
        bar.update(done, f"requeued {done}")
    bar.close()
    text = term.getvalue()
    assert text.count("\r") == 11
    assert text.endswith("[" + "#" * 30 + "] 1,000/1,000 requeued 1000\n")
    assert text.count("\n") == 1  # one line, redrawn


def test_progress_writes_sparse_lines_elsewhere():
    """A log file or CI job gets a plain line every ``every`` seconds and the last one,
    never a carriage return."""
    log, clock = io.StringIO(), Clock()
    bar = Progress(OutputWrapper(log), 1000, clock=clock, every=5.0)
    for done in range(0, 1001, 10):
        clock.now += 0.1  # 10 s in all
        bar.update(done)
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert 2 <= len(lines) <= 4, lines
    assert lines[-1] == "1,000/1,000 (100%)"


def test_progress_disabled_writes_nothing():
    term = Terminal()
    bar = Progress(OutputWrapper(term), 10, enabled=False)
    bar.update(5)
    bar.close(10)
    assert term.getvalue() == ""


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_rmq_requeue_reports_progress_on_its_own_stderr(rmq, capsys):
    from tests.test_parking import _park_real_failures

    _park_real_failures(rmq, 3)
    out, err = io.StringIO(), io.StringIO()
    call_command("rmq_requeue", stdout=out, stderr=err)
    assert "Requeued 3, failed 0" in out.getvalue()
    assert err.getvalue().splitlines()[-1] == "requeue 3/3 (100%) requeued 3 failed 0"
    assert "\r" not in err.getvalue()  # not a terminal: no redrawn bar
    assert capsys.readouterr().err == ""  # nothing around the command's stream


# rmq_requeue selects as the admin's list does -----------------------------------------------
@pytest.mark.django_db
def test_rmq_requeue_takes_the_admins_filters_group_first():
    from datetime import timedelta

    from django.utils import timezone

    from tests.test_admin import make_row

    group = "KeyError at shop/receipts.py:send"
    now = timezone.now()
    old = now - timedelta(days=2)
    make_row(fingerprint=group, attempts=5, last_failure_at=now)
    make_row(fingerprint=group, attempts=1, last_failure_at=old)
    make_row(fingerprint="ValueError at shop/orders.py:pay", attempts=5, last_failure_at=now)
    make_row(fingerprint=group, status="requeued")  # not parked: never selected

    def would(*args: str) -> str:
        out = io.StringIO()
        call_command("rmq_requeue", *args, "--dry-run", stdout=out)
        return out.getvalue().strip()

    assert would("--group", group) == "2 parked message(s) would be requeued."
    assert would("--fingerprint", group) == would("--group", group)  # one option, two names
    assert would("--group", group, "--group", "ValueError at shop/orders.py:pay").startswith("3 ")
    assert would("--group", group, "--min-attempts", "3").startswith("1 ")
    assert would("--group", group, "--failed-until", "1d").startswith("1 ")
    assert would("--failed-since", "1d").startswith("2 ")  # the rows failed just now
    assert would("--group", "nothing like it").startswith("0 ")


@pytest.mark.django_db
def test_the_failure_groups_page_gives_each_groups_command_and_it_selects_the_group(
    admin_client,
):
    import html
    import shlex

    from django.urls import reverse

    from tests.test_admin import make_row

    for _ in range(3):
        make_row(fingerprint="KeyError at shop/receipts.py:send")
    make_row(fingerprint="it's a group; with $hell characters")
    make_row(
        receiver="tests.testapp.consumers.beta", fingerprint="KeyError at shop/receipts.py:send"
    )
    page = admin_client.get(reverse("admin:django_rmq_retry_parkedmessage_summary"))
    groups = page.context["groups"]
    assert len(groups) == 3
    for group in groups:
        assert group["shell"] in html.unescape(page.content.decode())
        argv = shlex.split(group["shell"])
        assert argv[:3] == ["python", "manage.py", "rmq_requeue"]
        out = io.StringIO()
        call_command(*argv[2:], stdout=out)
        assert out.getvalue() == f"{group['count']} parked message(s) would be requeued.\n"


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_ctrl_c_pauses_the_operation_and_says_what_happened(rmq):
    """Ctrl-C of an attached ``rmq_requeue`` while a consumer steps the same operation: it
    stays paused (nothing steps it on), the command says so with the counts, and a resume
    finishes it with every message once."""
    from collections import Counter

    from django.db.models import Q
    from django.utils import timezone

    from django_rmq_retry.models import OperationState, RequeueOperation
    from django_rmq_retry.parking import operations
    from tests import waiting
    from tests.conftest import ROOT, Child, read_log, start_consumer, subprocess_env
    from tests.test_operations import park_rows

    n = 200
    park_rows(rmq, [{"id": i} for i in range(n)])
    consumer = start_consumer(rmq.prefix, rmq.log, "alpha")
    cli = Child(
        [sys.executable, str(ROOT / "manage.py"), "rmq_requeue", "--rate", "20", "--no-progress"],
        subprocess_env(rmq.prefix, rmq.log),
        rmq.log.with_name("cli.out"),
    )
    try:
        waiting.until(
            "the operation sent something",
            lambda: RequeueOperation.objects.filter(sent__gt=0).exists(),
            child=cli,
        )
        cli.send_signal(signal.SIGINT)
        out, _ = cli.communicate(timeout=120)
        op = RequeueOperation.objects.get()
        assert cli.returncode == 1, out
        assert f"CommandError: Operation #{op.pk} paused (" in out, out
        assert f"`manage.py rmq_operations --resume {op.pk}`" in out
        # The CLI waits SHUTDOWN_TIMEOUT for its step to end its batch; on a loaded host
        # the step may outlast it, and the CLI exits saying its step was cut short: the
        # lease then lapses (a taker counts that batch sent, never sends it again).
        waiting.until(
            "no step in flight",
            lambda: RequeueOperation.objects.filter(
                Q(lease_until__isnull=True) | Q(lease_until__lt=timezone.now()), pk=op.pk
            ).exists(),
        )
        op.refresh_from_db()
        assert (op.state, op.state_changed_by) == (OperationState.PAUSED, "cli")
        assert op.sent < n
        assert operations.advance(op.pk) is None  # paused: nobody steps it
        assert operations.resume(op.pk, "ops")
        waiting.until(
            "the operation done",
            lambda: RequeueOperation.objects.get(pk=op.pk).state == OperationState.DONE,
            child=consumer,
        )
    finally:
        consumer.send_signal(signal.SIGTERM)
        consumer.communicate(timeout=60)
    handled = Counter(e["id"] for e in read_log(rmq.log) if e["event"] == "done")
    assert handled == Counter(range(n))  # each once, across the pause


# rmq_consume says what it does --------------------------------------------------------------
@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_rmq_consume_announces_what_it_consumes_at_the_default_verbosity(rmq):
    out = io.StringIO()
    call_command("rmq_consume", "gamma", max_idle_time=0.2, stdout=out)
    text = out.getvalue()
    first = text.splitlines()[0]
    assert first == (
        "Consuming 2 queue(s) on amqp://guest:***@127.0.0.1:5672/%2F "
        "(prefetch 20, 1 thread, 1 process):"
    ), text
    assert "  tests.testapp.consumers.gamma <- test.other\n" in text
    assert f"  {rmq.prefix}.orphans (messages the broker gave up on: parked)" in text
    assert "Ctrl-C or SIGTERM stops after the running messages finish" in text
    quiet = io.StringIO()
    call_command("rmq_consume", "gamma", max_idle_time=0.2, stdout=quiet, verbosity=0)
    assert "Consuming" not in quiet.getvalue()


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_first_sigint_says_what_it_waits_for_and_how_to_exit_now(rmq):
    from tests.conftest import read_log, start_consumer, wait_for
    from tests.testapp.events import other

    call_command("rmq_consume", setup_only=True, verbosity=0)
    other.send({"id": 1, "sleep": 3})
    proc = start_consumer(rmq.prefix, rmq.log, "gamma")
    assert wait_for(lambda: any(e["event"] == "start" for e in read_log(rmq.log)), 60)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert (
        "SIGINT: stopping, waiting for 1 running message to finish (at most 30 s, "
        "SHUTDOWN_TIMEOUT); messages not started go back to their queues. Press Ctrl-C again "
        "(or send SIGINT again) to exit now." in out
    ), out
    assert "Stopped: 1 handled" in out


# Forgot migrate ------------------------------------------------------------------------------
MIGRATE_LINE = "run `manage.py migrate django_rmq_retry`."


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    from tests.conftest import ROOT

    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def unmigrated(rmq, tmp_path):
    """The environment of a ``manage.py`` child on a new, empty SQLite database."""
    from tests.conftest import subprocess_env

    env = subprocess_env(rmq.prefix, rmq.log)
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'new.sqlite3'}"
    return env


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_commands_say_to_run_migrate_instead_of_a_traceback(unmigrated):
    for command in (
        ["rmq_requeue", "--dry-run"],
        ["rmq_purge_parked", "--older-than", "30d"],
        ["rmq_purge_inbox"],
        ["rmq_relay", "--once"],
        ["rmq_setup"],
    ):
        done = _manage(unmigrated, *command)
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert (
            "CommandError: The tables of django_rmq_retry do not exist in database 'default'"
            in (done.stderr)
        ), (command, done.stderr)
        assert MIGRATE_LINE in done.stderr
        assert "Traceback" not in done.stderr


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_the_consumer_and_the_database_check_say_to_run_migrate(unmigrated):
    done = _manage(unmigrated, "rmq_consume", "gamma", "--max-idle-time", "0.5", "--no-relay")
    assert done.returncode == 1, done.stderr
    assert "CommandError: The tables of django_rmq_retry do not exist in database 'default'" in (
        done.stderr
    )
    assert MIGRATE_LINE in done.stderr
    assert "Consuming" not in done.stdout  # it consumes nothing without its tables
    plain = _manage(unmigrated, "check")  # no --database: no query, no warning
    assert "W010" not in plain.stdout + plain.stderr
    asked = _manage(unmigrated, "check", "--database", "default")
    assert "django_rmq_retry.W010" in asked.stderr, asked.stderr
    assert "HINT: Run `manage.py migrate django_rmq_retry`." in asked.stderr
    migrating = _manage(unmigrated, "migrate", "-v", "1")
    assert migrating.returncode == 0, migrating.stderr
    assert "W010" not in migrating.stdout + migrating.stderr  # no news while it migrates
    after = _manage(unmigrated, "check", "--database", "default")
    assert "W010" not in after.stderr
    consume = _manage(unmigrated, "rmq_consume", "gamma", "--max-idle-time", "0.5", "--no-relay")
    assert consume.returncode == 0, consume.stderr
    assert "migrate" not in consume.stderr
    # An upgrade whose new table is not there yet: it runs, and says what is missing.
    import sqlite3

    with sqlite3.connect(unmigrated["DATABASE_URL"].removeprefix("sqlite:///")) as db:
        db.execute("DROP TABLE django_rmq_retry_inboxentry")
    upgrade = _manage(unmigrated, "rmq_consume", "gamma", "--max-idle-time", "0.5", "--no-relay")
    assert upgrade.returncode == 0, upgrade.stderr
    assert (
        "1 table(s) of django_rmq_retry are missing in database 'default' "
        "(django_rmq_retry_inboxentry): run `manage.py migrate django_rmq_retry`."
    ) in upgrade.stderr
    assert "Consuming 2 queue(s)" in upgrade.stdout


# Say what to do ------------------------------------------------------------------------------
@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_a_send_nobody_receives_names_the_receivers_this_process_knows(rmq):
    from django_rmq_retry import Topic
    from django_rmq_retry.core.errors import UnroutableError

    call_command("rmq_consume", setup_only=True, verbosity=0)
    with pytest.raises(UnroutableError) as caught:
        Topic("test.nobody").send({"id": 1})
    text = str(caught.value)
    assert "No receiver of 'test.nobody' is registered in this process (receivers known: " in text
    assert "tests.testapp.consumers.gamma <- test.other" in text
    assert "INSTALLED_APPS" in text and "'receivers.py' module" in text


def test_the_hint_for_a_known_receiver_without_a_queue_says_to_declare_it():
    from django_rmq_retry.registry import default_registry

    hint = default_registry.unrouted_hint("test.other", "receivers")
    assert hint.startswith(
        "This process knows the receiver(s) of 'test.other' (tests.testapp.consumers.gamma), "
        "but their queue is not on the broker: run `manage.py rmq_setup`"
    )


def test_without_the_app_in_installed_apps_the_hints_say_to_add_it(settings):
    """A project that imports Topic but forgot INSTALLED_APPS: the hints must not name
    commands its manage.py does not have."""
    from django_rmq_retry.publishing.results import undeclared_hint
    from django_rmq_retry.registry import default_registry

    installed = [app for app in settings.INSTALLED_APPS if app != "django_rmq_retry"]
    assert default_registry.unrouted_hint("test.other", "receivers").startswith("This process")
    settings.INSTALLED_APPS = installed
    for hint in (
        default_registry.unrouted_hint("test.other", "receivers"),
        undeclared_hint("404 NOT_FOUND - no exchange 'rmq_retry_test.work' in vhost '/'"),
    ):
        assert "'django_rmq_retry' is not in INSTALLED_APPS: add it" in hint
        assert "start `manage.py rmq_consume`" not in hint


@pytest.mark.django_db
def test_a_closed_port_says_connection_refused_not_a_pika_class(settings):
    import socket

    from django.core.management.base import CommandError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings.RMQ_RETRY = {
        **settings.RMQ_RETRY,
        "BROKER_URL": f"amqp://u:secret@127.0.0.1:{port}/%2F",
    }
    with pytest.raises(CommandError) as caught:
        call_command("rmq_consume", "gamma", fail_fast=True, stdout=io.StringIO())
    assert str(caught.value) == (
        f"cannot reach RabbitMQ at amqp://u:***@127.0.0.1:{port}/%2F: connection refused "
        "(is RabbitMQ running, on that host and port?)"
    )


# Fail at the call ----------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_send_on_commit_refuses_a_body_that_is_not_json_at_the_call():
    from django.db import transaction

    from tests.testapp.events import other

    with transaction.atomic():
        with pytest.raises(TypeError, match="not JSON serialisable"):
            other.send_on_commit({"id": 1, "when": object()})
        # Nothing was scheduled for the commit: it would have raised there, after the
        # caller's rows were committed.
        assert transaction.get_connection().run_on_commit == []


def test_send_on_commit_sends_what_it_was_given_through_the_test_broker(transactional_db):
    from django_rmq_retry.testing import InMemoryBroker
    from tests.testapp.events import other

    with InMemoryBroker() as broker:
        other.send_on_commit({"id": 7})  # no transaction: now
        assert [m.body for m in broker.sent] == [{"id": 7}]


# Help that answers ---------------------------------------------------------------------------
DJANGO_OPTIONS = {
    "help",
    "version",
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
}


def _parsers():
    from django.core.management import get_commands, load_command_class

    for name, app in sorted(get_commands().items()):
        if app == "django_rmq_retry":
            yield name, load_command_class(app, name).create_parser("manage.py", name)


def test_every_option_of_every_command_has_help():
    missing = [
        (name, action.option_strings or action.dest)
        for name, parser in _parsers()
        for action in parser._actions
        if action.dest not in DJANGO_OPTIONS and not (action.help or "").strip()
    ]
    assert missing == []
    assert {name for name, _ in _parsers()} >= {"rmq_consume", "rmq_requeue", "rmq_purge_parked"}


def _help_of(command: str, dest: str) -> str:
    parser = dict(_parsers())[command]
    (action,) = [a for a in parser._actions if a.dest == dest]
    return " ".join(action.help.split()) % {"default": action.default}


def test_help_shows_the_effective_default_of_each_setting(settings):
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "PREFETCH": 7, "BATCH_SIZE": 250}
    assert "(default: 7, RMQ_RETRY['PREFETCH'])" in _help_of("rmq_consume", "prefetch")
    assert "(default: 1, RMQ_RETRY['THREADS'])" in _help_of("rmq_consume", "threads")
    assert "(default: 250, RMQ_RETRY['BATCH_SIZE'])" in _help_of("rmq_requeue", "batch_size")
    assert "(default: 7 days, RMQ_RETRY['INBOX_RETENTION_DAYS'])" in _help_of(
        "rmq_purge_inbox", "older_than"
    )
    assert "(default: default)" in _help_of("rmq_recount_parked", "database")
    reasons = _help_of("rmq_requeue", "reason")
    from django_rmq_retry.core.outcome import ParkReason

    assert all(reason.value in reasons for reason in ParkReason)
    assert "EVERY parked message is requeued" in dict(_parsers())["rmq_requeue"].description


@pytest.mark.django_db
def test_list_says_up_to_for_jittered_delays(settings):
    retry = {**settings.RMQ_RETRY["RETRY"], "jitter": "full", "max_attempts": 4}
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "RETRY": retry}
    out = io.StringIO()
    call_command("rmq_consume", "alpha", list=True, stdout=out)
    initial, factor = retry["initial_delay"], retry["multiplier"]
    caps = ", ".join(f"{min(initial * factor**k, retry['max_delay']):g}s" for k in range(3))
    assert (
        f"  retry:    4 attempts, delays up to {caps} "
        "(full jitter: each a random time between 0 and that)\n"
    ) in out.getvalue(), out.getvalue()
    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "RETRY": {**retry, "jitter": "none"}}
    out = io.StringIO()
    call_command("rmq_consume", "alpha", list=True, stdout=out)
    assert f"delays {caps} (no jitter)\n" in out.getvalue()


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
@pytest.mark.undeclared
def test_a_send_before_the_topology_is_declared_says_to_run_rmq_setup(rmq, settings):
    from django_rmq_retry.core.errors import PublishError
    from django_rmq_retry.publishing.per_thread import reset_publisher
    from tests.testapp.events import other

    settings.RMQ_RETRY = {**settings.RMQ_RETRY, "DECLARE_ON_SEND": False}
    reset_publisher()
    with pytest.raises(PublishError) as caught:
        other.send({"id": 1})  # a new prefix: nothing declared yet
    assert f"404 NOT_FOUND - no exchange '{rmq.prefix}.work'" in str(caught.value)
    assert (
        "The topology is not declared on this broker: run `manage.py rmq_setup` (or start "
        "`manage.py rmq_consume`) with the same BROKER_URL and PREFIX first"
    ) in str(caught.value)


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_rmq_relay_says_what_it_relays_and_what_a_stop_waits_for(rmq):
    from tests.conftest import ROOT, Child, subprocess_env, wait_for

    out = rmq.log.with_name("relay.out")
    relay = Child(
        [sys.executable, str(ROOT / "manage.py"), "rmq_relay"],
        subprocess_env(rmq.prefix, rmq.log),
        out,
    )
    assert wait_for(lambda: "Relaying the outbox" in relay.output(), 60), relay.output()
    relay.send_signal(signal.SIGTERM)
    text, _ = relay.communicate(timeout=60)
    assert relay.returncode == 0, text
    assert (
        "Relaying the outbox of database 'default' to amqp://guest:***@127.0.0.1:5672/%2F. "
        "Ctrl-C or SIGTERM stops after the rows being published are confirmed." in text
    )
    assert "SIGTERM: stopping once the rows being published are confirmed" in text
    assert "Stopped: 0 published" in text

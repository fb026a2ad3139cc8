"""What ``manage.py rmq_doctor`` examines before (and after) a broker upgrade.

Each check gives lines that are fine (``Finding(ok=True)``) and problems with their fix:

* **version**: the broker's own (``connection.start``) against the oldest we support and,
  with quorum queues, the dead-letter fixes (``core.broker_rules``);
* **binding keys**: none with more than two ``#`` (refused from 4.3.5);
* **delay engine**: with ``DELAY_ENGINE = "quorum-native"``, RabbitMQ 4.3 or later;
* **deprecated features**: what 4.3 denies by default (transient non-exclusive queues,
  global QoS) is never declared by this code; said once, with what 4.x changed for the
  configured queue type;
* **permissions**, for what each process does (``send``, ``consume``, ``setup``): probes
  that touch no message (``broker.probes``);
* **topology drift**: every exchange and queue declared again with the code's arguments
  (missing, or with other arguments: a 406 names which); needs configure permission, else
  only missing objects are found;
* **orphans**: receiver queues no receiver owns (``orphans``), and retries waiting in the
  orphan queue with nobody to park them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from django.db import DatabaseError

from .. import broker
from ..broker import probes
from ..broker.topology import queue_state
from ..conf import app_settings, current_names, current_plan, quorum_native
from ..core.broker_rules import MAX_HASHES, parse_version, too_many_hashes, version_problems
from ..core.names import Names
from ..core.native_retry import VERSION_FLOOR
from ..core.topology_plan import Plan, permissions
from ..registry import Receiver
from . import orphans

ROLES = ("send", "consume", "setup")


@dataclass(frozen=True)
class Finding:
    """One line of the report: fine (``ok``), or a problem and its fix."""

    ok: bool
    what: str
    fix: str = ""

    def line(self) -> str:
        if self.ok:
            return f"ok: {self.what}"
        return f"PROBLEM: {self.what}. Fix: {self.fix}"


def examine(receivers: Iterable[Receiver], roles: Sequence[str]) -> list[Finding]:
    """Every check above against the configured broker (the first URL that answers)."""
    receivers = list(receivers)
    names = current_names()
    the_plan = current_plan(receivers, names)
    queue_type = str(app_settings.QUEUE_TYPE)
    conn = broker.connect(name="django-rmq-retry doctor")
    try:
        version = probes.server_version(conn.url)
        out = [*_version(version, queue_type, broker.mask_url(conn.url))]
        out += _binding_keys(receivers, the_plan)
        out += _deprecated(version, queue_type)
        out += _delay_engine(version)
        refusals = _permissions(conn, names, the_plan, roles)
        out += refusals
        may_configure = "setup" in roles and all(f.ok for f in refusals if "setup" in f.what)
        out += _drift(conn, the_plan, compare=may_configure)
        out += _orphans(conn, names)
    finally:
        conn.close()
    return out


def _version(version: str, queue_type: str, where: str) -> list[Finding]:
    problems = version_problems(version, queue_type)
    if not problems:
        return [Finding(True, f"RabbitMQ {version} at {where}, {queue_type} queues")]
    return [Finding(False, p.split(": upgrade")[0], "upgrade the broker") for p in problems]


def _binding_keys(receivers: list[Receiver], the_plan: Plan) -> list[Finding]:
    keys = [(rec.name, key) for rec in receivers for key in rec.routing_keys]
    keys += [(q.name, b.routing_key) for q in the_plan.queues for b in q.bindings]
    keys += [(dest, key) for dest, _source, key in the_plan.exchange_bindings]
    bad = {key for key in too_many_hashes(k for _owner, k in keys)}
    found = [
        Finding(
            False,
            f"{owner} binds {key!r}, with more than {MAX_HASHES} '#' (RabbitMQ 4.3.5+ "
            "refuses it at declare)",
            "use at most two '#' in a binding key ('*' matches one word)",
        )
        for owner, key in keys
        if key in bad
    ]
    return found or [Finding(True, f"{len(keys)} binding key(s), none with more than two '#'")]


def _delay_engine(version: str) -> list[Finding]:
    """With ``DELAY_ENGINE = "quorum-native"``: the broker must have the quorum queues'
    delayed retry (an older one accepts the arguments and redelivers at once)."""
    if not quorum_native():
        return []
    parsed = parse_version(version)
    floor = ".".join(map(str, VERSION_FLOOR))
    if parsed is not None and parsed >= VERSION_FLOOR:
        return [Finding(True, f"quorum-native delay engine: RabbitMQ {version} >= {floor}")]
    return [
        Finding(
            False,
            f"DELAY_ENGINE is quorum-native but RabbitMQ {version} is older than {floor} "
            "(it ignores the delayed-retry arguments: every retry would come back at once)",
            f'upgrade the broker to {floor} or later, or set DELAY_ENGINE = "cascade"',
        )
    ]


def _deprecated(version: str, queue_type: str) -> list[Finding]:
    said = (
        "deprecated features: none used (every queue durable and non-exclusive, QoS per "
        "consumer, no plugin)"
    )
    parsed = parse_version(version)
    if queue_type == "classic" and parsed is not None and parsed >= (4, 0, 0):
        said += "; classic queues are not replicated on 4.x (QUEUE_TYPE='quorum' is)"
    return [Finding(True, said)]


def _permissions(
    conn: broker.Connection, names: Names, the_plan: Plan, roles: Sequence[str]
) -> list[Finding]:
    vhost = _vhost(conn.url)
    needs = dict(zip(ROLES, permissions(names.prefix), strict=True))
    probe_key = f"rmq-doctor-probe-{uuid.uuid4().hex}"  # bound by nothing: returned
    out: list[Finding] = []
    for role in roles:
        need = needs[role]
        fix = (
            f"rabbitmqctl set_permissions -p {vhost} <user> '{need.configure}' "
            f"'{need.write}' '{need.read}' (docs/howto/permissions.md)"
        )
        target = {
            "send": names.work_exchange,
            "consume": names.delay_exchange(0),
            "setup": names.work_exchange,
        }[role]
        if not _exchange_exists(conn, target):  # the topology check says it is missing
            out.append(Finding(True, f"{role}: not probed ({target} does not exist)"))
            continue
        if role == "setup":
            kind, args = next((k, a) for n, k, a in the_plan.exchanges if n == target)
            refused = probes.may_configure(conn, target, kind, args)
        else:
            refused = probes.may_publish(conn, target, probe_key)
        if refused is None and role == "consume" and _exists(conn, names.orphan_queue):
            refused = probes.may_bind(conn, names.orphan_queue, names.orphan_exchange, "")
        if refused is None:
            out.append(Finding(True, f"this user may {role} under {names.prefix!r}"))
        else:
            out.append(Finding(False, f"this user may not {role}: {refused}", fix))
    return out


def _vhost(url: str) -> str:
    return unquote(urlsplit(url).path[1:]) or "/"


def _exists(conn: broker.Connection, queue: str) -> bool:
    return queue_state(conn.raw.channel(), queue) is not None


def _exchange_exists(conn: broker.Connection, exchange: str) -> bool:
    return not probes.drifted(conn, Plan([(exchange, "topic", {})], [], []), compare=False)


def _drift(conn: broker.Connection, the_plan: Plan, *, compare: bool) -> list[Finding]:
    found = probes.drifted(conn, the_plan, compare=compare)
    count = f"{len(the_plan.exchanges)} exchange(s), {len(the_plan.queues)} queue(s)"
    setup = "run 'manage.py rmq_setup' (as a user that may configure)"
    if len(found) == len(the_plan.exchanges) + len(the_plan.queues) and all(
        what == "missing" for _obj, what in found
    ):
        return [Finding(False, f"none of the {count} of this code exists", setup)]
    out = [
        Finding(False, f"{obj} is missing", setup)
        if what == "missing"
        else Finding(
            False,
            f"{obj} differs from what the code declares: {what}",
            "RabbitMQ cannot change arguments in place: drain and delete it, then run "
            "'manage.py rmq_setup'; or make the settings match what it has",
        )
        for obj, what in found
    ]
    if out:
        return out
    if compare:
        return [Finding(True, f"topology: {count} exist with the arguments the code declares")]
    return [
        Finding(
            True,
            f"topology: {count} exist (arguments not compared: run the doctor with --role "
            "setup as a user that may configure)",
        )
    ]


def _orphans(conn: broker.Connection, names: Names) -> list[Finding]:
    out: list[Finding] = []
    try:
        found = orphans.find(conn)
    except DatabaseError as exc:
        return [Finding(True, f"orphan queues not checked (database: {exc})")]
    out += [
        Finding(
            False,
            f"orphan queue {orphans.describe(o)}",
            "'manage.py rmq_orphans --delete' (once drained), or give the receiver "
            "queue= its old name",
        )
        for o in found
    ]
    state = queue_state(conn.raw.channel(), names.orphan_queue)
    if state is not None and state[0] and not state[1]:
        out.append(
            Finding(
                False,
                f"{state[0]} message(s) wait in {names.orphan_queue} (retries whose receiver "
                "queue was gone) and nothing consumes it",
                "start 'manage.py rmq_consume': it parks them for an operator",
            )
        )
    return out or [Finding(True, "no orphan queues, nothing waits in the orphan queue")]

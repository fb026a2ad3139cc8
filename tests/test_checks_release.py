"""Checks of a first release: our own tag, the permissions statement (``check --deploy``),
DECLARE_ON_SEND's type, and receivers in Django Channels' ``consumers`` module."""

from __future__ import annotations

import re

import pytest
from django.apps import apps
from django.core import checks
from django.test import override_settings

from django_rmq_retry.checks import TAG, check_settings
from django_rmq_retry.conf import app_settings
from django_rmq_retry.core.topology_plan import permissions
from django_rmq_retry.registry import discovery


def _ids(messages):
    return [m.id for m in messages]


def test_our_checks_run_under_our_tag_only():
    assert TAG in checks.registry.registry.tags_available()
    assert "django_rmq_retry.E015" in _ids(_run({"DECLARE_ON_SEND": "yes"}, tags=[TAG]))
    assert "django_rmq_retry.E015" not in _ids(
        _run({"DECLARE_ON_SEND": "yes"}, tags=[checks.Tags.compatibility])
    )


def _run(conf, **kwargs):
    with override_settings(RMQ_RETRY=conf):
        return checks.run_checks(**kwargs)


def test_deploy_checks_state_each_processes_permissions():
    with override_settings(RMQ_RETRY={"PREFIX": "shop.v2"}):
        plain = checks.run_checks(tags=[TAG])
        deploy = checks.run_checks(tags=[TAG], include_deployment_checks=True)
    assert "django_rmq_retry.I001" not in _ids(plain)
    (info,) = [m for m in deploy if m.id == "django_rmq_retry.I001"]
    assert (
        "publisher (web and worker processes that send): configure '^$' write '^shop\\.v2\\.' read '^$'"
        in info.msg
    )
    assert "set_permissions" in info.hint


def test_the_permission_regexes_cover_every_name_we_declare_and_no_other():
    from django_rmq_retry.conf import current_plan
    from django_rmq_retry.core.names import Names
    from django_rmq_retry.registry import default_registry

    publisher, consumer, setup = permissions("shop.v2")
    plan = current_plan(default_registry.all(), Names("shop.v2"))
    names = [n for n, _k, _a in plan.exchanges] + [q.name for q in plan.queues]
    assert all(re.match(setup.configure, n) for n in names)
    assert not re.match(setup.configure, "shopXv2.work")  # the dot is escaped
    assert not re.match(publisher.configure, "shop.v2.work")
    assert not re.match(consumer.configure, "shop.v2.work")
    assert re.match(consumer.read, "shop.v2.delay.03")


@pytest.mark.parametrize("key", ["DECLARE_ON_SEND", "ASYNC_ON_IO_LOOP"])
def test_switches_must_be_bools(key):
    assert "django_rmq_retry.E015" in _ids(_checks({key: "false"}))
    assert "django_rmq_retry.E015" not in _ids(_checks({key: True}))


def _checks(conf):
    with override_settings(RMQ_RETRY=conf):
        return check_settings()


def test_receivers_in_a_consumers_module_warn_when_channels_is_installed(monkeypatch):
    installed = apps.is_installed
    monkeypatch.setattr(apps, "is_installed", lambda name: name == "channels" or installed(name))
    (warning,) = [m for m in _checks({}) if m.id == "django_rmq_retry.W002"]
    assert "tests.testapp.consumers" in warning.msg
    assert "receivers.py" in warning.hint
    monkeypatch.setattr(apps, "is_installed", installed)
    assert "django_rmq_retry.W002" not in _ids(_checks({}))


def test_discovery_looks_in_receivers_and_still_in_consumers(monkeypatch):
    seen = []
    monkeypatch.setattr(discovery, "autodiscover_modules", seen.append)
    discovery.autodiscover()
    assert app_settings.DISCOVER_MODULE == "receivers"
    assert seen[:2] == ["receivers", "consumers"]
    with override_settings(RMQ_RETRY={"DISCOVER_MODULE": "consumers"}):
        seen.clear()
        discovery.autodiscover()
        assert seen[:1] == ["consumers"] and "receivers" not in seen


@pytest.mark.parametrize("prefix", ["rmq_retry", "a-b", "app.v1"])
def test_permission_regexes_match_the_prefix_literally(prefix):
    (publisher, *_rest) = permissions(prefix)
    assert re.match(publisher.write, f"{prefix}.work")
    assert not re.match(publisher.write, f"{prefix}x.work")

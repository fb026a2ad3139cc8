"""ops/: the Prometheus rules and the Grafana dashboard parse, and name only metrics we export.

``promtool check rules`` runs too where promtool is installed (``PROMTOOL`` names it
elsewhere: e.g. extracted from Debian's prometheus package)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
pytest.importorskip("prometheus_client")

OPS = Path(__file__).resolve().parent.parent / "ops"
RULES = OPS / "prometheus" / "django-rmq-retry.rules.yml"
DASHBOARD = OPS / "grafana" / "django-rmq-retry.json"
NAME = re.compile(r"\bdjango_rmq_retry_[a-z_]+\b")
RECORDED = re.compile(r"\bdjango_rmq_retry:[a-z0-9_:]+\b")


def exported() -> set[str]:
    """Every sample name our endpoint can serve."""
    from prometheus_client import CollectorRegistry

    from django_rmq_retry.observability.metrics import DATABASE_METRICS, ConsumerMetrics

    registry = CollectorRegistry()
    ConsumerMetrics(registry)
    names = set(DATABASE_METRICS)
    for family in registry.collect():
        if family.type == "counter":
            names |= {family.name + "_total", family.name + "_created"}
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_count", "_sum", "_created")}
        else:
            names.add(family.name)
    return names


def balanced(expr: str) -> bool:
    depth = {"(": 0, "[": 0, "{": 0}
    pairs = {")": "(", "]": "[", "}": "{"}
    quoted = False
    for ch in expr:
        if ch == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif ch in depth:
            depth[ch] += 1
        elif ch in pairs:
            depth[pairs[ch]] -= 1
            if depth[pairs[ch]] < 0:
                return False
    return not quoted and not any(depth.values())


def rules() -> list[dict]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def test_the_rules_name_exported_metrics_and_parse():
    names = exported()
    found = rules()
    recorded = {r["record"] for r in found if "record" in r}
    alerts = {r["alert"] for r in found if "alert" in r}
    assert {
        "DjangoRmqRetryParkedBacklogGrowing",
        "DjangoRmqRetryHighRetryRate",
        "DjangoRmqRetryConsumerNotReady",
        "DjangoRmqRetryRetriesLate",
    } <= alerts
    for rule in found:
        expr = rule["expr"]
        assert balanced(expr), expr
        assert set(NAME.findall(expr)) <= names, (expr, set(NAME.findall(expr)) - names)
        assert set(RECORDED.findall(expr)) <= recorded, expr
        assert NAME.search(expr) or RECORDED.search(expr), expr
        if "alert" in rule:
            assert rule["labels"]["severity"] in ("warning", "critical")
            assert rule["annotations"]["summary"]


def test_promtool_accepts_the_rules():
    promtool = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool is not installed (PROMTOOL=path runs it)")
    done = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_the_dashboard_is_grafana_json_naming_exported_metrics():
    names = exported()
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "django-rmq-retry"
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panel {p['title']} overlaps another"
                cells.add((x, y))
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert balanced(t["expr"]), t["expr"]
            used = set(NAME.findall(t["expr"]))
            assert used and used <= names, (p["title"], used - names)
    shown = {n for p in panels for t in p["targets"] for n in NAME.findall(t["expr"])}
    # The metrics an operator needs at 3 a.m. are on it.
    for must in ("messages_total", "parked_messages", "consumer_ready", "retry_lateness_seconds"):
        assert any(must in n for n in shown), must

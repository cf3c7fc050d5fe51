"""deploy/grafana-dashboard.json charts the metrics dockflow exports: every series it queries
exists (so a renamed metric fails here, not on an operator's screen at night), and the issue's
list is all there."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY

import core.metrics  # noqa: F401 - registers dockflow's metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"
SERIES = re.compile(r"\b(dockflow_[a-z_]+)")


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]


def _exported() -> set[str]:
    """Every series name dockflow's registry can expose (histograms: _bucket, _sum, _count)."""
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "histogram":
            names.update(f"{family.name}{s}" for s in ("_bucket", "_sum", "_count"))
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def test_every_series_the_dashboard_queries_is_exported():
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {name for expr in _exprs(dashboard) for name in SERIES.findall(expr)}

    assert queried
    assert queried <= _exported(), queried - _exported()
    for expr in _exprs(dashboard):
        assert expr.count("(") == expr.count(")"), expr
        assert '{job=~"$job"}' in expr  # every panel follows the job picker


def test_the_dashboard_charts_what_an_operator_needs():
    dashboard = json.loads(DASHBOARD.read_text())
    queried = " ".join(_exprs(dashboard))

    for needed in (
        "sum by (status) (rate(dockflow_readings_total",
        "dockflow_reading_batch_size_sum",
        "dockflow_reading_batch_store_seconds_bucket",
        "sum by (status) (rate(dockflow_documents_total",
        "dockflow_feed_lag_messages",
        "dockflow_subscriptions",
        "sum by (outcome) (rate(dockflow_webhook_attempts_total",
        "sum by (code) (increase(dockflow_exceptions_total",
    ):
        assert needed in queried, needed
    assert dashboard["uid"] == "dockflow-overview"
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "job"}
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))

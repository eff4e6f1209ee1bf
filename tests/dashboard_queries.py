"""The queries of the Grafana dashboards in dashboards/, read for the tests that check them against
what tracerag emits (the exposition here, a real Prometheus in the backend tests)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from pipeline_fixtures import REPO

DASHBOARDS = REPO / "dashboards"
GRAFANA_GLOBALS = {
    "__rate_interval",
    "__interval",
    "__range",
    "__url_time_range",
    "__value",
    "__data",
    "__field",
    "__series",
    "__all",
}
PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan", "le",
}  # fmt: skip


def dashboards() -> list[tuple[str, dict[str, Any]]]:
    files = sorted(DASHBOARDS.glob("*.json"))
    assert files, "no dashboards found"
    return [(f.name, json.loads(f.read_text(encoding="utf-8"))) for f in files]


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def datasource_type(dashboard: dict[str, Any], ds: Any) -> str | None:
    if isinstance(ds, dict):
        if ds.get("type"):
            return str(ds["type"])
        ds = ds.get("uid")
    if isinstance(ds, str):
        name = ds.strip("${}")
        for var in dashboard["templating"]["list"]:
            if var["name"] == name and var["type"] == "datasource":
                return str(var["query"])
    return None


def queries(kind: str) -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, query) for every target on a datasource of ``kind``."""
    found = []
    for name, dash in dashboards():
        for panel in all_panels(dash.get("panels", [])):
            for target in panel.get("targets", []):
                ds = target.get("datasource") or panel.get("datasource")
                if datasource_type(dash, ds) != kind:
                    continue
                query = target.get("expr") if kind == "prometheus" else target.get("query")
                assert query, f"{name}: panel {panel.get('title')!r} has an empty {kind} query"
                found.append((name, panel.get("title", ""), query))
        for var in dash["templating"]["list"]:
            if var["type"] == "query" and datasource_type(dash, var.get("datasource")) == kind:
                q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
                found.append((name, f"variable {var['name']}", q))
    return found


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (strings, matchers, ranges and label lists removed)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w$.])[A-Za-z_:][\w:]*", s):
        rest = s[m.end() :].lstrip()
        if rest.startswith("("):
            continue  # a function or aggregation
        if m.group(0).lower() in PROMQL_WORDS:
            continue
        names.add(m.group(0))
    return names


def label_values_metric(query: str) -> set[str]:
    m = re.match(r"\s*label_values\(\s*([A-Za-z_:][\w:]*)", query)
    return {m.group(1)} if m else set()

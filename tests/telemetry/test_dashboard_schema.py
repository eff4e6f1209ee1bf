"""The dashboards in dashboards/ read by Grafana's published dashboard schema.

``grafana-foundation-sdk`` (Apache-2.0) carries Grafana's dashboard schema as typed models,
generated from the schema Grafana publishes. Each dashboard is decoded into those models and
encoded back: a key the schema does not know is dropped on the way, a panel type or a query
datasource it does not know decodes as unknown. So every key must come back as written, save a
short list of keys Grafana reads that the schema leaves out (each with its reason).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from dashboard_queries import all_panels, dashboards
from grafana_foundation_sdk.cog import plugins, runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

plugins.register_default_plugins()

#: keys Grafana reads that the schema's models leave out, by where they are
OUTSIDE_THE_SCHEMA = {
    # the export envelope Grafana's import screen reads (datasource inputs, required plugins)
    "/__inputs",
    "/__requires",
    # a query variable's query as its editor shows it (Grafana writes it beside ``query``)
    "/templating/list[*]/definition",
    # Tempo queries' result table (traces or spans) and spans per span set: Tempo query fields
    # newer than the schema version the SDK was generated from
    "/panels[*]/targets[*]/tableType",
    "/panels[*]/targets[*]/spss",
}

#: core panel types whose options the schema does not model (they have none to check)
WITHOUT_OPTIONS = {"traces"}


def dropped(written: Any, read: Any, path: str = "") -> list[str]:
    """The keys of ``written`` missing or changed in ``read``, as paths (list indices as *)."""
    if isinstance(written, dict):
        if not isinstance(read, dict):
            return [f"{path}: not an object"]
        out = []
        for key, value in written.items():
            where = f"{path}/{key}"
            out += [where] if key not in read else dropped(value, read[key], where)
        return out
    if isinstance(written, list):
        if not isinstance(read, list) or len(read) != len(written):
            return [f"{path}: list changed"]
        return [p for w, r in zip(written, read, strict=True) for p in dropped(w, r, f"{path}[*]")]
    return [] if written == read else [f"{path}: {written!r} read as {read!r}"]


def round_trip(data: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(json.dumps(Dashboard.from_json(data), cls=JSONEncoder))
    return result


@pytest.mark.parametrize("name", [name for name, _ in dashboards()])
def test_every_key_is_one_the_schema_knows(name: str) -> None:
    (data,) = [d for n, d in dashboards() if n == name]
    unknown = sorted(set(dropped(data, round_trip(data))) - OUTSIDE_THE_SCHEMA)
    assert not unknown, f"{name}: not in Grafana's dashboard schema: {unknown}"


@pytest.mark.parametrize("name", [name for name, _ in dashboards()])
def test_every_panel_type_and_query_is_known_to_the_schema(name: str) -> None:
    (data,) = [d for n, d in dashboards() if n == name]
    for panel in all_panels(data["panels"]):
        if panel["type"] == "row":
            continue
        if panel["type"] not in WITHOUT_OPTIONS:
            assert runtime.panelcfg_config(panel["type"]) is not None, (name, panel["type"])
        for target in panel.get("targets", []):
            kind = (target.get("datasource") or panel["datasource"])["type"]
            query = runtime.dataquery_from_json(target, kind)
            assert not isinstance(query, runtime.UnknownDataquery), (name, panel["title"], kind)


def test_a_key_outside_the_schema_is_caught() -> None:
    """The check can fail: a misspelt panel key and an unknown panel type are both found."""
    _, data = dashboards()[0]
    broken = copy.deepcopy(data)
    panel = next(p for p in broken["panels"] if p["type"] != "row")
    panel["gridPoss"] = panel.pop("gridPos")
    assert "/panels[*]/gridPoss" in dropped(broken, round_trip(broken))
    assert runtime.panelcfg_config("timeseriess") is None

"""A few builders for Grafana dashboard JSON (schema 39, Grafana 10/11). Only what our dashboards use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

DS = {"type": "prometheus", "uid": "${datasource}"}


class Layout:
    """Places panels left to right on Grafana's 24-column grid, wrapping to new lines."""

    def __init__(self) -> None:
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.panels: list[dict] = []
        self._id = 0

    def _next_id(self) -> int:
        self._id += 1
        return self._id

    def row(self, title: str) -> None:
        if self.x:
            self.y += self.row_h
        self.x, self.row_h = 0, 0
        self.panels.append(
            {"type": "row", "title": title, "id": self._next_id(), "collapsed": False, "panels": [],
             "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}}
        )  # fmt: skip
        self.y += 1

    def add(self, panel: dict, w: int = 12, h: int = 8) -> dict:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        panel["id"] = self._next_id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        self.panels.append(panel)
        return panel


def target(
    expr: str, legend: str = "", *, ref: str = "A", instant: bool = False, table: bool = False
) -> dict:
    t: dict[str, Any] = {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend or "__auto"}
    if instant or table:
        t.update(instant=True, range=False)
    else:
        t.update(instant=False, range=True)
    if table:
        t["format"] = "table"
    return t


def refs(targets: list[dict]) -> list[dict]:
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    return targets


def timeseries(
    title: str, targets: list[dict], *, unit: str = "short", desc: str = "", stack: bool = False
) -> dict:
    return {
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": refs(targets),
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {
                    "drawStyle": "line",
                    "lineWidth": 1,
                    "fillOpacity": 10 if stack else 0,
                    "showPoints": "never",
                    "spanNulls": False,
                    "stacking": {"mode": "normal" if stack else "none", "group": "A"},
                },
            },
            "overrides": [],
        },  # fmt: skip
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },  # fmt: skip
    }


def stat(title: str, targets: list[dict], *, unit: str = "short", desc: str = "") -> dict:
    return {
        "type": "stat",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": refs(targets),
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
        },  # fmt: skip
    }


def table(title: str, targets: list[dict], *, desc: str = "", rename: dict[str, str] | None = None,
          units: dict[str, str] | None = None, hide: tuple[str, ...] = ("Time",)) -> dict:  # fmt: skip
    """A table of instant queries (format table), merged into one row per label set."""
    overrides = [
        {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]}
        for name, unit in (units or {}).items()
    ]
    return {
        "type": "table",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": refs(targets),
        "fieldConfig": {
            "defaults": {"custom": {"align": "auto", "filterable": True}},
            "overrides": overrides,
        },
        "options": {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}},
        "transformations": [
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {"excludeByName": {h: True for h in hide}, "renameByName": rename or {}},
            },
        ],
    }


def xychart(title: str, targets: list[dict], *, x: str, y_unit: str = "short", series_by: str | None = None,
            desc: str = "", x_label: str = "", y_label: str = "") -> dict:  # fmt: skip
    """Y (the query value) against the numeric label `x`; one series per value of `series_by`."""
    transformations: list[dict] = [
        {"id": "merge", "options": {}},
        {"id": "convertFieldType",
         "options": {"conversions": [{"targetField": x, "destinationType": "number"}], "fields": {}}},
        {"id": "sortBy", "options": {"sort": [{"field": x}]}},
    ]  # fmt: skip
    if series_by:
        transformations.append(
            {"id": "partitionByValues", "options": {"fields": [series_by], "keepFields": False,
                                                    "naming": {"asLabels": True}}}
        )  # fmt: skip
    return {
        "type": "xychart",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": refs(targets),
        "transformations": transformations,
        "fieldConfig": {"defaults": {"unit": y_unit, "custom": {"show": "points+lines", "pointSize": {"fixed": 6},
                                                                "axisLabel": y_label}},
                        "overrides": [{"matcher": {"id": "byName", "options": x},
                                       "properties": [{"id": "custom.axisLabel", "value": x_label or x}]}]},
        "options": {"seriesMapping": "auto", "dims": {"x": x}, "legend": {"showLegend": True,
                                                                             "displayMode": "list"}},
    }  # fmt: skip


def datasource_var() -> dict:
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []}  # fmt: skip


def query_var(name: str, query: str, *, label: str = "", multi: bool = True, include_all: bool = True,
              sort: int = 1) -> dict:  # fmt: skip
    v = {
        "name": name,
        "label": label or name,
        "type": "query",
        "datasource": DS,
        "definition": query,
        # The plain string form: Grafana parses label_values(metric{filters}, label) into its editor model itself.
        # (An object with qryType 1 would need label/metric fields, or Grafana renders label_values(undefined).)
        "query": query,
        "refresh": 2,  # on time range change: new runs appear without a reload
        "sort": sort,
        "multi": multi,
        "includeAll": include_all,
        "current": {},
        "options": [],
        "hide": 0,
        "regex": "",
    }
    if include_all:
        v["allValue"] = ".*"
    return v


def dashboard(uid: str, title: str, panels: list[dict], variables: list[dict], *, desc: str,
              annotations: Sequence[dict] = (), time_from: str = "now-1h", refresh: str = "") -> dict:  # fmt: skip
    builtin = {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
               "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}  # fmt: skip
    return {
        "id": None,
        "uid": uid,
        "title": title,
        "description": desc,
        "tags": ["servesweep"],
        "editable": True,
        "graphTooltip": 1,  # shared crosshair: client and server panels on one time axis
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": time_from, "to": "now"},
        "refresh": refresh,
        "timepicker": {},
        "timezone": "",
        "links": [
            {
                "type": "dashboards",
                "tags": ["servesweep"],
                "asDropdown": True,
                "title": "servesweep",
                "keepTime": True,
                "includeVars": True,
            }
        ],  # fmt: skip
        "annotations": {"list": [builtin, *annotations]},
        "templating": {"list": variables},
        "panels": panels,
    }

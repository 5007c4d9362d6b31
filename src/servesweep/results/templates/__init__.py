"""HTML templates of the report and the comparison (Jinja2, autoescaped). They live in Python strings so they ship
with the package without package-data rules; the page is self-contained (inline CSS and SVG, no script, no URL)."""

from __future__ import annotations

from functools import cache

CSS = """
:root { --fg:#1d2330; --muted:#5d6675; --line:#d9dde5; --bad:#b3261e; --good:#1b7f3b; --warn:#8a5a00; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       margin: 0 auto; max-width: 1280px; padding: 16px 24px 64px; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 18px 0 6px; } .muted { color: var(--muted); }
table { border-collapse: collapse; margin: 6px 0 14px; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid var(--line); padding: 3px 8px; text-align: right; vertical-align: top; }
th { background: #f3f5f8; font-weight: 600; } td.l, th.l { text-align: left; }
.banner { padding: 10px 14px; margin: 10px 0; border-radius: 6px; font-weight: 700; }
.banner.dry { background: #fff3cd; border: 2px solid #d39e00; color: #6b4e00; font-size: 18px; letter-spacing: .05em; }
.banner.warn { background: #fdecea; border: 1px solid var(--bad); color: var(--bad); }
.bad { color: var(--bad); font-weight: 600; } .good { color: var(--good); } .warn { color: var(--warn); }
.verdict-worse { color: var(--bad); font-weight: 600; } .verdict-better { color: var(--good); font-weight: 600; }
.verdict-noise { color: var(--muted); }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
figure.plot { margin: 0; border: 1px solid var(--line); border-radius: 6px; padding: 6px; background: #fff; }
figure.plot svg { display: block; width: 560px; height: auto; max-width: 100%; }
figcaption { font-size: 12px; color: var(--muted); max-width: 560px; }
details { margin: 6px 0; } pre { background: #f6f8fa; padding: 8px; overflow: auto; font-size: 12px; }
table.points { font-size: 12.5px; } table.points th, table.points td { padding: 3px 5px; }
table.points th { font-weight: 600; font-size: 12px; line-height: 1.25; }
table.points td { white-space: nowrap; } table.points td.wrap { white-space: normal; } tr.degraded td { background: #fdecea; } .held { color: var(--bad); font-weight: 600; }
.badge { display: inline-block; white-space: nowrap; font-size: 11px; line-height: 1.3; padding: 0 5px;
         margin: 0 2px 1px 0; border: 1px solid #d39e00; border-radius: 8px; background: #fff3cd; color: #6b4e00; }
.badge.bad { border-color: var(--bad); background: var(--bad); color: #fff; font-weight: 700; }
#degraded-banner p { margin: 0 0 4px; } #degraded-banner ul { margin: 0; padding-left: 20px; font-weight: 400; }
dl.legend { display: grid; grid-template-columns: max-content 1fr; gap: 2px 10px; margin: 0 0 8px; font-size: 12px; }
dl.legend dd { margin: 0; color: var(--muted); } details.flag-details { font-size: 12px; }
code { font-size: 12px; } dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 4px 0; }
dl.kv dt { color: var(--muted); } dl.kv dd { margin: 0; }
"""

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>{{ css }}</style>
</head><body>
{% if banner %}<div class="banner dry" id="dry-run-banner">{{ banner }}</div>{% endif %}
{{ body }}
<p class="muted">Written by servesweep {{ version }} at {{ written }}. Every number comes from the per-request
records (records.parquet) with the definitions of docs/metrics.md.</p>
</body></html>
"""

COMPARE_SECTION = """<section id="comparison">
{% for rc in comparisons %}
<h2>Comparison: {{ rc.b.run_id }} vs baseline {{ rc.a.run_id }}</h2>
<p class="compare-summary"><strong>{{ rc.summary_line() }}</strong></p>
<p class="muted">{{ rc.points|length }} matching points; {{ rc.settings.resamples }} bootstrap resamples (seed
{{ rc.settings.seed }}), {{ (rc.settings.confidence * 100)|round(1) }}% intervals, changes under
{{ (rc.settings.min_effect * 100)|round(1) }}% are within noise, and an interval that includes zero and reaches past
±{{ (rc.settings.min_effect * 100)|round(1) }}% is "not enough requests to tell". Relative changes are (run − baseline) / baseline;
error rate in percentage points.</p>
<table class="compare">
<thead><tr><th class="l">point</th><th class="l">metric</th><th>baseline</th><th>run</th><th>change</th>
<th>interval</th><th class="l">verdict</th></tr></thead>
<tbody>
{% for pc in rc.points %}{% for c in pc.changes %}
<tr data-point="{{ pc.b.point_id }}" data-metric="{{ c.metric.name }}" data-verdict="{{ c.verdict }}">
{% if loop.first %}<td class="l{{ ' bad' if pc.degraded else '' }}" rowspan="{{ pc.changes|length }}"{% if pc.degraded %} data-degraded="{{ pc.degraded|join(',') }}"{% endif %}>{{ pc.label }}</td>{% endif %}
<td class="l">{{ c.metric.label }}</td><td>{{ fmt_value(c.a, c.metric.unit) }}</td><td>{{ fmt_value(c.b, c.metric.unit) }}</td>
<td>{{ fmt_change(c) }}</td><td>{{ fmt_ci(c) }}</td>
<td class="l verdict-{{ {'better':'better','worse':'worse'}.get(c.verdict, 'noise') }}">{{ c.verdict }}</td></tr>
{% endfor %}{% endfor %}
</tbody></table>
{% if rc.only_a or rc.only_b %}<p class="warn">Unmatched points: baseline only {{ rc.only_a|join(', ') or '-' }};
run only {{ rc.only_b|join(', ') or '-' }}.</p>{% endif %}
{% endfor %}
</section>
"""

REPORT_BODY = """<h1>servesweep report: {{ run.run_id }}</h1>
{% if degraded %}<div class="banner warn" id="degraded-banner">
<p>{{ degraded|length }} point(s) DEGRADED: measured at a lower load than asked (a Locust worker was lost), so
their figures describe another load than their label says. <code>servesweep gate</code> fails them (exit 2) unless
<code>--allow-degraded</code>; run them again to measure the asked load.</p>
<ul>{% for r in degraded %}<li data-point="{{ r.info.point_id }}"><strong>{{ r.info.point_id }}</strong>: {{ r.degraded.text }}</li>
{% endfor %}</ul></div>{% endif %}
{% if needle_warnings %}<div class="banner warn" id="needle-banner"><ul>{% for w in needle_warnings %}<li>{{ w }}</li>
{% endfor %}</ul></div>{% endif %}
<dl class="kv" id="run-facts">
{% for k, v in facts %}<dt>{{ k }}</dt><dd>{{ v }}</dd>
{% endfor %}</dl>
{% if decision %}<h2 id="decision">Decision</h2>
<p class="{{ 'good' if decision.complete else 'warn' }}" id="decision-label"><strong>{{ decision.label }}</strong></p>
<p class="muted">Per workload shape and tier: the configuration that serves the most output tok/s per GPU at its
capacity for the tier, and that value's interval ({{ '%.0f'|format(decision.confidence * 100) }}% per interval,
ties within {{ '%.0f'|format(decision.resolution * 100) }}%). {{ decision.probes }} probes,
{{ '%.0f'|format(decision.gpu_seconds) }} GPU-s, {{ '%.0f'|format(decision.elapsed_s) }} s{% if decision.budget_s %}
(budget {{ '%.0f'|format(decision.budget_s) }} s){% endif %}; decision.json has every probe.</p>
<table id="decision-table"><thead><tr><th class="l">shape</th><th class="l">tier</th><th class="l">SLOs</th><th class="l">state</th>
<th class="l">best</th><th>low</th><th>estimate</th><th>high</th><th class="l">capacity bracket</th><th class="l">still in</th><th class="l">raced out</th></tr></thead><tbody>
{% for q in decision.questions %}<tr data-state="{{ q.state }}"><td class="l">{{ q.shape }}</td><td class="l">{{ q.tier }}</td>
<td class="l">{{ q.slos|join(', ') }}</td><td class="l {{ 'good' if q.state in ('decided', 'tie', 'none') else 'warn' }}">{{ q.state }}</td>
<td class="l">{{ q.best or '-' }}</td>
{% if q.value %}<td>{{ fmt(q.value.low) }}</td><td>{{ fmt(q.value.estimate) }}</td><td>{{ fmt(q.value.high) }}</td>
<td class="l">{{ q.value.bracket|join(' - ') }}</td>{% else %}<td>-</td><td>-</td><td>-</td><td class="l">-</td>{% endif %}
<td class="l">{{ q.alive|join(', ') }}</td><td class="l">{{ q.dropped|join(', ') or '-' }}</td></tr>
{% endfor %}</tbody></table>
{% endif %}
{% set broken = run.points|rejectattr('status', 'equalto', 'done')|list %}
{% if broken %}
<h2 id="not-measured">Points not measured</h2>
<table id="not-measured-table"><thead><tr><th class="l">point</th><th class="l">configuration</th><th class="l">status</th>
<th class="l">reason</th></tr></thead><tbody>
{% for p in broken %}<tr data-point="{{ p.point_id }}" data-status="{{ p.status }}"><td class="l">{{ p.point_id }}</td>
<td class="l">{{ p.config_id or '-' }}</td>
<td class="l {{ 'muted' if p.status == 'infeasible' else 'bad' }}">{{ p.status }}</td><td class="l">{{ p.reason or '-' }}</td></tr>
{% endfor %}</tbody></table>
{% endif %}
{% if overview %}<h2>Overview</h2><div class="plots">
{% for kind, caption, svg in overview %}<figure class="plot" data-plot="{{ kind }}">{{ svg|safe }}<figcaption>{{ caption }}</figcaption></figure>
{% endfor %}</div>{% endif %}
{% for sec in sections %}
<section class="config" data-config="{{ sec.config_id }}" id="config-{{ sec.config_id or 'server' }}">
<h2>{{ sec.title }}</h2>
{% if sec.rows %}
{% set same = constant_axes(sec) %}
<h3>By concurrency</h3>
{% if same %}<p class="muted axes">Every point: {{ same.values()|join(', ') }}.</p>{% endif %}
<table class="points"><thead><tr>{% if 'workload' not in same %}<th class="l">workload</th>{% endif %}<th>prompt</th>
{% if 'output' not in same %}<th>output</th>{% endif %}<th>concur&shy;rency</th>
{% for c in columns %}<th>{{ c[1] }}</th>{% endfor %}<th>ok</th><th class="l">failures</th><th class="l">SLO</th>
<th class="l">flags</th></tr></thead><tbody>
{% for r in sec.rows %}<tr data-point="{{ r.info.point_id }}"{% if r.degraded %} class="degraded" data-degraded="true"{% endif %}>
{% if 'workload' not in same %}<td class="l">{{ r.info.workload }}</td>{% endif %}<td>{{ r.info.prompt_tokens }}</td>
{% if 'output' not in same %}<td>{{ r.info.output_tokens }}</td>{% endif %}
<td data-key="concurrency" data-value="{{ r.info.concurrency }}"{% if r.degraded %} class="bad"{% endif %}>{{ r.info.concurrency }}{% if r.degraded and r.degraded.held_concurrency is not none %}<span class="held" title="held: mean requests in flight in the records">→{{ '%.1f'|format(r.degraded.held_concurrency) }}</span>{% endif %}</td>
{% for key, head, name, unit, dec in columns %}{% set few = r.few(key) %}<td data-key="{{ key }}" data-value="{{ r.values[key] }}"{% if few is not none %} data-samples="{{ few }}" class="warn" title="from {{ few }} values"{% endif %}>{{ fmt(r.values[key], dec, unit == '%') }}{% if few is not none %} <sup class="small-n">n={{ few }}</sup>{% endif %}</td>{% endfor %}
<td data-key="ok" data-value="{{ r.ok }}">{{ r.ok }}</td>
<td class="l wrap {{ 'bad' if r.failed else '' }}" data-key="failed" data-value="{{ r.failed }}">{{ failures_text(r) }}</td>
<td class="l wrap {{ 'bad' if 'breach' in slo_text(r) else '' }}">{{ slo_text(r) }}</td>
<td class="l flags" data-key="flags" data-value="{{ r.flags|map(attribute='code')|join(',') }}">{% for f in r.flags %}<span class="badge{{ ' bad' if f.code == 'DEGRADED' else '' }}" data-flag="{{ f.code }}" title="{{ f.text }}">{{ f.code }}</span>{% else %}-{% endfor %}</td></tr>
{% endfor %}</tbody></table>
{% set legend = section_legend(sec) %}
{% if legend %}<dl class="legend flag-legend">
{% for code, meaning in legend %}<dt><span class="badge{{ ' bad' if code == 'DEGRADED' else '' }}">{{ code }}</span></dt><dd>{{ meaning }}</dd>
{% endfor %}</dl>
<details class="flag-details"><summary>what each flagged point showed</summary><ul>
{% for r in sec.rows if r.flags %}{% for f in r.flags %}<li data-point="{{ r.info.point_id }}">{{ r.info.point_id }}: <span class="badge">{{ f.code }}</span> {{ f.text }}</li>
{% endfor %}{% endfor %}</ul></details>{% endif %}
{% if small_rows(sec) %}<p class="warn small-sample-note">{{ small_note }}</p>{% endif %}
{% set keys, prompts, cells = pivot(sec) %}
<h3>By prompt length</h3>
<table class="by-prompt"><thead><tr><th class="l">workload</th><th>output</th><th>concurrency</th>
{% for pl in prompts %}<th>prompt {{ pl }}: tok/s</th><th>prompt {{ pl }}: TTFT p50 ms</th>{% endfor %}</tr></thead><tbody>
{% for k in keys %}<tr><td class="l">{{ k[0] }}</td><td>{{ k[1] }}</td><td>{{ k[2] }}</td>
{% for pl in prompts %}{% set r = cells.get((k, pl)) %}
<td>{{ fmt(r.values.output_tokens_per_s) if r else '-' }}</td><td>{{ fmt(r.values.ttft_p50) if r else '-' }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>
{% set sscols, ssrows = server_state_table(sec) %}
<h3>Server state</h3>
{% if sscols %}<table class="server-state"><thead><tr><th class="l">workload</th><th>prompt</th><th>output</th><th>concurrency</th>
{% for c in sscols %}<th>{{ c[1] }}</th>{% endfor %}</tr></thead><tbody>
{% for r, cells in ssrows %}<tr data-point="{{ r.info.point_id }}"><td class="l">{{ r.info.workload }}</td><td>{{ r.info.prompt_tokens }}</td>
<td>{{ r.info.output_tokens }}</td><td>{{ r.info.concurrency }}</td>
{% set gauges = cells|selectattr(0, 'in', gauge_columns)|list %}
{% for key, text, raw in cells %}{% if text == few_samples and key in gauge_columns %}{% if key == gauges[0][0] %}<td class="muted few-samples" colspan="{{ gauges|length }}" data-key="gauges" data-samples="{{ r.server_state.samples }}">{{ few_samples }} ({{ r.server_state.samples }} over {{ '%.1f'|format(r.server_state.span_s or 0) }} s) to read the gauges: they would show the state before or after the load</td>{% endif %}{% else %}<td data-key="{{ key }}" data-value="{{ raw }}"{% if text == no_state %} class="muted"{% endif %}>{{ text }}</td>{% endif %}{% endfor %}</tr>
{% endfor %}</tbody></table>
{% set unote = utilization_note(sec) %}{% if unote %}<p class="muted utilization-note">{{ unote }}</p>{% endif %}
<p class="server-state-note">{{ server_state_note }}</p>
{% else %}<p class="muted server-state-note">{{ no_state }} not recorded for these points (a run folder written before servesweep sampled /metrics, or a server without SGLang's metrics).</p>{% endif %}
<h3>Diagnosis</h3>
<table class="diagnosis"><thead><tr><th class="l">workload</th><th>prompt</th><th>output</th><th>concurrency</th><th class="l">why</th></tr></thead><tbody>
{% for r in sec.rows %}{% if r.why %}<tr data-point="{{ r.info.point_id }}"><td class="l">{{ r.info.workload }}</td><td>{{ r.info.prompt_tokens }}</td><td>{{ r.info.output_tokens }}</td><td>{{ r.info.concurrency }}</td><td class="l why" data-key="why" data-value="{{ r.why.first or r.why.status }}">{{ r.why.line }}</td></tr>
{% endif %}{% endfor %}</tbody></table>
{% for k in sec.knees %}<p class="knee">saturation, {{ k }}</p>
{% endfor %}
<div class="plots">
{% for kind, caption, svg in sec.plots %}<figure class="plot" data-plot="{{ kind }}">{{ svg|safe }}<figcaption>{{ caption }}</figcaption></figure>
{% endfor %}</div>
{% else %}<p class="bad">No point of this configuration was measured.</p>{% endif %}
{% if sec.config %}{% set rrows, server = resolved(sec.config) %}
<h3>Server configuration</h3>
<dl class="kv"><dt>status</dt><dd class="{{ 'bad' if sec.config.get('error') else '' }}">{{ sec.config.get('status', '-') }}{% if sec.config.get('error') %}: {{ sec.config.error }}{% endif %}</dd>
{% if sec.config.get('planned') %}<dt>planner estimate</dt><dd>{{ fmt_s(sec.config.planned.get('est_s')) }}</dd>{% endif %}
{% if sec.config.get('ready_after_s') is not none %}<dt>ready after</dt><dd>{{ fmt_s(sec.config.ready_after_s) }}</dd>{% endif %}
{% if server.get('argv') %}<dt>command</dt><dd><code>{{ server.argv|join(' ') }}</code></dd>{% endif %}
</dl>
{% if rrows %}<table class="resolved"><thead><tr><th class="l">setting</th><th class="l">asked</th><th class="l">server reports</th></tr></thead><tbody>
{% for k, a, v in rrows %}<tr><td class="l">{{ k }}</td><td class="l">{{ a }}</td><td class="l {{ 'warn' if a != '-' and v != '-' and a|lower != v|lower else '' }}">{{ v }}</td></tr>
{% endfor %}</tbody></table>{% endif %}
{% if server.get('mismatches') %}<p class="bad">The server differs from what was asked: {{ server.mismatches }}</p>{% endif %}
{% if server %}<details><summary>everything the server reported</summary><pre>{{ server|tojson(indent=1) }}</pre></details>{% endif %}
{% endif %}
{% set est = sec.points|selectattr('est_s', 'ne', none)|rejectattr('status', 'equalto', 'infeasible')|list %}
{% if est %}<h3>Planner estimate vs actual time</h3>
<table class="estimates"><thead><tr><th class="l">point</th><th class="l">status</th><th>estimate</th><th>actual</th><th>actual / estimate</th></tr></thead><tbody>
{% for p in est %}<tr data-point="{{ p.point_id }}"><td class="l">{{ p.point_id }}</td><td class="l">{{ p.status }}</td><td>{{ fmt_s(p.est_s) }}</td>
<td>{{ fmt_s(p.actual_s) }}</td><td>{{ fmt(p.actual_s / p.est_s, 2) if p.actual_s and p.est_s else '-' }}</td></tr>
{% endfor %}</tbody></table>{% endif %}
</section>
{% endfor %}
{{ comparison|safe }}
{{ answers|safe }}
{% if events %}<details><summary>run events</summary><pre>{% for e in events %}{{ e.t }}  {{ e.event }}
{% endfor %}</pre></details>{% endif %}
"""

TEMPLATES = {
    "page.html.j2": PAGE,
    "compare_section.html.j2": COMPARE_SECTION,
    "report_body.html.j2": REPORT_BODY,
}


@cache
def _env():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.DictLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env


def render(name: str, **ctx) -> str:
    from datetime import UTC, datetime
    from importlib import metadata

    from markupsafe import Markup

    ctx.setdefault("css", Markup(CSS))
    ctx.setdefault("written", datetime.now(UTC).isoformat(timespec="seconds"))
    try:
        ctx.setdefault("version", metadata.version("servesweep"))
    except metadata.PackageNotFoundError:
        ctx.setdefault("version", "?")
    if "body" in ctx and isinstance(ctx["body"], str):
        ctx["body"] = Markup(ctx["body"])
    return _env().get_template(name).render(**ctx)

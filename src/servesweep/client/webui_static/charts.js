// servesweep's LLM charts: inline SVG drawn from series.json and live.json of this Locust UI (no library, no CDN).
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const W = 600, H = 220, L = 56, R = 12, T = 10, B = 30;
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  // About n round tick values over [lo, hi]; integers only when asked (concurrency).
  function ticks(lo, hi, n, integer) {
    if (!(hi > lo)) hi = lo + 1;
    let step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
    for (const m of [1, 2, 5, 10]) { if ((hi - lo) / (step * m) <= n) { step *= m; break; } }
    if (integer) step = Math.max(1, Math.round(step));
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) out.push(+v.toFixed(6));
    return out;
  }

  function fmt(v) {
    const a = Math.abs(v);
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (a >= 100 || Number.isInteger(v)) return v.toFixed(0);
    return v.toPrecision(3);
  }

  // A drawable point: both coordinates finite numbers. A step that has just started has "-" cells, a sample of a
  // quiet window null ones: such points are left out, never allowed to set the axes (NaN would blank the chart).
  const finite = p => Number.isFinite(p[0]) && Number.isFinite(p[1]);

  // series: [{name, pts: [[x, y]...]}]; opts: {xFmt, integerX, xLabel}
  function draw(id, series, opts) {
    const svg = document.getElementById("c-" + id);
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    series = series.map(s => ({name: s.name, pts: s.pts.filter(finite)}));
    const pts = series.flatMap(s => s.pts);
    const legend = document.getElementById("l-" + id);
    legend.innerHTML = series.map((s, i) =>
      `<span><i style="background:${COLORS[i % COLORS.length]}"></i>${s.name}</span>`).join("");
    if (!pts.length) {
      el("text", {x: W / 2, y: H / 2, "text-anchor": "middle"}, svg).textContent = "no data yet";
      return;
    }
    let x0 = Math.min(...pts.map(p => p[0])), x1 = Math.max(...pts.map(p => p[0]));
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    const y1 = Math.max(...pts.map(p => p[1])) * 1.08 || 1;
    const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R);
    const sy = y => H - B - y / y1 * (H - T - B);
    el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#888"}, svg);
    el("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#888"}, svg);
    for (const v of ticks(0, y1, 5, false)) {
      el("line", {x1: L, y1: sy(v), x2: W - R, y2: sy(v), stroke: "#eee"}, svg);
      el("text", {x: L - 4, y: sy(v) + 4, "text-anchor": "end"}, svg).textContent = fmt(v);
    }
    for (const v of ticks(x0, x1, 7, opts.integerX)) {
      el("text", {x: sx(v), y: H - B + 14, "text-anchor": "middle", class: "xtick"}, svg).textContent = opts.xFmt(v);
    }
    el("text", {x: (L + W - R) / 2, y: H - 3, "text-anchor": "middle"}, svg).textContent = opts.xLabel;
    series.forEach((s, i) => {
      const good = s.pts;
      if (!good.length) return;
      const d = good.map((p, j) => `${j ? "L" : "M"}${sx(p[0]).toFixed(1)} ${sy(p[1]).toFixed(1)}`).join(" ");
      el("path", {d, fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 2,
                  "data-series": s.name, "data-points": good.length}, svg);
      if (good.length < 40) {
        for (const p of good) el("circle", {cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: COLORS[i % COLORS.length]}, svg);
      }
    });
  }

  function liveCharts(data) {
    const s = data.samples.filter(x => x);
    if (!s.length) return;
    const t0 = s[0].t;
    const line = (name, key) => ({name, pts: s.map(x => [x.t - t0, x[key]])});
    const opts = {xFmt: v => fmt(v) + " s", integerX: false, xLabel: "seconds since the first sample"};
    draw("ttft", [line("p50", "ttft_p50_ms"), line("p99", "ttft_p99_ms")], opts);
    draw("itl", [line("p99 per chunk", "itl_p99_ms"), line("p99 per token", "itl_per_token_p99_ms")], opts);
    draw("tps", [line("output tok/s (last 10 s)", "output_tps")], opts);
    draw("flight", [line("streams in flight", "in_flight"), line("users", "users")], opts);
    document.getElementById("status").textContent =
      `${s.length} samples; last at ${new Date(s[s.length - 1].t * 1000).toLocaleTimeString()}`;
  }

  function stepCharts(steps, columns) {
    // A cell as a number, or NaN for "", "-" and a missing cell (a step with no finished request yet)
    const num = v => (typeof v === "number" ? v : parseFloat(v));
    const rows = steps.map(r => ({x: num(r.conc), r})).filter(o => Number.isFinite(o.x)).sort((a, b) => a.x - b.x);
    const line = (name, key) => ({name, pts: rows.map(o => [o.x, num(o.r[key])])});
    const opts = {xFmt: v => fmt(v), integerX: true, xLabel: "concurrency (users of the step)"};
    draw("sttft", [line("p50", "TTFT p50 ms"), line("p99", "TTFT p99 ms")], opts);
    draw("sitl", [line("p99 per chunk", "ITL/chunk p99 ms")], opts);
    draw("stps", [line("output tok/s", "out tok/s")], opts);
    const table = document.getElementById("steps");
    table.tHead.innerHTML = "<tr>" + columns.map(c => `<th>${c}</th>`).join("") + "</tr>";
    table.tBodies[0].innerHTML = steps.map(r =>
      "<tr>" + columns.map(c => `<td>${r[c] === undefined ? "" : r[c]}</td>`).join("") + "</tr>").join("");
  }

  async function refresh() {
    try {
      const series = await (await fetch("series.json", {cache: "no-store"})).json();
      liveCharts(series);
      const live = await (await fetch("live.json", {cache: "no-store"})).json();
      stepCharts(live.steps || [], series.step_columns || []);
    } catch (e) {
      document.getElementById("status").textContent = "no data: " + e;
    }
  }
  refresh();
  setInterval(refresh, 2000);
})();

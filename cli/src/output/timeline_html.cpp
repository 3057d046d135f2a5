// The timeline as an HTML page (timeline_chart.hpp): the data as JSON, drawn by inline script
// with zoom and hover details.

#include "output/chart_style.hpp"
#include "output/display_names.hpp"
#include "output/json_text.hpp"
#include "output/timeline_chart.hpp"

#include <nlohmann/json.hpp>

namespace remat::report {

namespace {

// Draws the chart from the embedded data; wheel zooms the time axis around the pointer,
// dragging pans, double-click resets, hovering shows the bucket's breakdown.
constexpr const char* kScript = R"JS(
(function () {
  const D = JSON.parse(document.getElementById('timeline-data').textContent);
  const W = 1200, H = 600, L = 90, R = 40, T = 30, B = 50, PW = W - L - R, PH = H - T - B;
  const n = D.totals.length;
  let lo = 0, hi = Math.max(n, 1);
  const chart = document.getElementById('chart'), tip = document.getElementById('tip');
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  function bytes(b) { let u = 0; while (b >= 1024 && u < 5) { b /= 1024; u++; } return (u ? b.toFixed(2) : b) + ' ' + units[u]; }
  function time(us) { const a = Math.abs(us); return a < 1e3 ? Math.round(us) + 'us' : a < 1e6 ? (us / 1e3).toPrecision(3) + 'ms' : (us / 1e6).toPrecision(4) + 's'; }
  function esc(s) { return String(s).replace(/[&<>"]/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c])); }
  function nice(range, count) { const raw = range / count, p = Math.pow(10, Math.floor(Math.log10(raw))); for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p; return 10 * p; }
  function render() {
    let ymax = 1; for (let b = lo; b < hi && b < n; b++) ymax = Math.max(ymax, D.totals[b]);
    let u = 0, unit = 1; while (ymax / unit >= 1024 && u < 5) { unit *= 1024; u++; }
    const ystep = nice(ymax / unit, 6) * unit; const ytop = Math.ceil(ymax / ystep) * ystep;
    const x = b => L + PW * (b - lo) / (hi - lo), y = v => T + PH * (1 - v / ytop);
    let s = `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-size="12"><rect width="${W}" height="${H}" fill="#fff"/>`;
    for (let v = 0; v <= ytop + 1; v += ystep) s += `<line x1="${L}" x2="${L + PW}" y1="${y(v)}" y2="${y(v)}" stroke="#e3e3e3"/><text x="${L - 8}" y="${y(v) + 4}" text-anchor="end">${+(v / unit).toFixed(2)} ${units[u]}</text>`;
    const span = (hi - lo) * D.bucket_us, xstep = Math.max(D.bucket_us, nice(span, 8));
    for (let t = Math.ceil(lo * D.bucket_us / xstep) * xstep; t <= hi * D.bucket_us; t += xstep) { const xx = x(t / D.bucket_us); s += `<line x1="${xx}" x2="${xx}" y1="${T}" y2="${T + PH}" stroke="#e3e3e3"/><text x="${xx}" y="${T + PH + 18}" text-anchor="middle">${time(t)}</text>`; }
    s += `<text x="${L + PW / 2}" y="${H - 10}" text-anchor="middle">time since the first event (wheel: zoom, drag: pan, double-click: reset)</text>`;
    s += `<svg x="${L}" y="${T}" width="${PW}" height="${PH}" viewBox="${L} ${T} ${PW} ${PH}">`;
    const below = new Float64Array(n), a = Math.max(0, Math.floor(lo)), e = Math.min(n, Math.ceil(hi));
    D.series.forEach(se => {
      let d = `M${x(a)},${y(below[a] || 0)}`;
      for (let b = a; b < e; b++) d += `V${y(below[b] + se.values[b])}H${x(b + 1)}`;
      for (let b = e - 1; b >= a; b--) d += `V${y(below[b])}H${x(b)}`;
      s += `<path d="${d}Z" fill="${se.color}"/>`;
      for (let b = a; b < e; b++) below[b] += se.values[b];
    });
    const pb = (D.peak_time_us - D.start_us) / D.bucket_us;
    if (pb >= lo && pb <= hi && D.peak_time_us !== null) s += `<line x1="${x(pb)}" x2="${x(pb)}" y1="${T}" y2="${T + PH}" stroke="#c00" stroke-dasharray="4 3"/><circle cx="${x(pb)}" cy="${y(D.peak_bytes)}" r="4" fill="#c00"/>`;
    s += `</svg><rect x="${L}" y="${T}" width="${PW}" height="${PH}" fill="none" stroke="#888"/>`;
    if (pb >= lo && pb <= hi && D.peak_time_us !== null) s += `<text x="${x(pb) + (x(pb) > L + PW * 0.7 ? -8 : 8)}" y="${Math.max(T + 14, y(D.peak_bytes) - 8)}" fill="#c00" font-weight="bold" text-anchor="${x(pb) > L + PW * 0.7 ? 'end' : 'start'}">peak ${bytes(D.peak_bytes)} at ${time(D.peak_time_us - D.start_us)}</text>`;
    chart.innerHTML = s + '</svg>';
  }
  function bucketAt(ev) { const r = chart.getBoundingClientRect(); return lo + (ev.clientX - r.left - L) / PW * (hi - lo); }
  chart.addEventListener('wheel', ev => {
    ev.preventDefault(); const c = bucketAt(ev), f = ev.deltaY < 0 ? 0.8 : 1.25;
    let nlo = c - (c - lo) * f, nhi = c + (hi - c) * f; if (nhi - nlo < 4) return;
    lo = Math.max(0, nlo); hi = Math.min(Math.max(n, 1), nhi); render();
  }, {passive: false});
  let drag = null;
  chart.addEventListener('mousedown', ev => { drag = {x: ev.clientX, lo, hi}; });
  window.addEventListener('mouseup', () => { drag = null; });
  chart.addEventListener('dblclick', () => { lo = 0; hi = Math.max(n, 1); render(); });
  chart.addEventListener('mousemove', ev => {
    if (drag) {
      const shift = (drag.x - ev.clientX) / PW * (drag.hi - drag.lo);
      const s = Math.max(-drag.lo, Math.min(Math.max(n, 1) - drag.hi, shift)); lo = drag.lo + s; hi = drag.hi + s; render(); return;
    }
    const b = Math.floor(bucketAt(ev));
    if (b < 0 || b >= n || b < lo || b >= hi) { tip.style.display = 'none'; return; }
    const rows = D.series.map(se => [se.label, se.values[b], se.color]).filter(r => r[1] > 0).sort((p, q) => q[1] - p[1]);
    tip.innerHTML = `<b>${time(b * D.bucket_us)} - ${time((b + 1) * D.bucket_us)}</b><br>total ${bytes(D.totals[b])}<table>` +
      rows.map(r => `<tr><td><span style="background:${r[2]}"></span>${esc(r[0])}</td><td>${bytes(r[1])}</td></tr>`).join('') + '</table>';
    tip.style.display = 'block'; tip.style.left = (ev.pageX + 14) + 'px'; tip.style.top = (ev.pageY + 10) + 'px';
  });
  chart.addEventListener('mouseleave', () => { tip.style.display = 'none'; });
  const legend = document.getElementById('legend');
  legend.innerHTML = D.series.slice().reverse().map(se => `<div><span style="background:${se.color}"></span>${esc(se.label)} <i>(peak ${bytes(se.peak)})</i></div>`).join('');
  render();
})();
)JS";

constexpr const char* kStyle = R"CSS(
body { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; margin: 20px; color: #222; }
h1 { font-size: 18px; margin: 0 0 4px; } .meta { color: #555; margin-bottom: 10px; }
#chart { cursor: crosshair; user-select: none; }
#legend { columns: 3 260px; margin: 6px 0 0 90px; } #legend div { margin: 3px 0; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; } #legend span, #tip span { display: inline-block; width: 11px; height: 11px; margin-right: 6px; }
#tip { position: absolute; display: none; background: rgba(255,255,255,0.96); border: 1px solid #999; padding: 6px 8px; font-size: 12px; pointer-events: none; }
#tip td { padding: 0 6px 0 0; }
)CSS";

}  // namespace

std::string timeline_html(const Timeline& t, const ChartText& text) {
  nlohmann::ordered_json data;
  data["start_us"] = t.start_us;
  data["bucket_us"] = t.bucket_us;
  data["totals"] = t.totals;
  data["peak_bytes"] = t.peak_bytes;
  data["peak_time_us"] = t.peak_time_us ? nlohmann::ordered_json(*t.peak_time_us) : nlohmann::ordered_json(nullptr);
  data["events"] = t.events;
  data["by"] = t.grouped_by;
  data["series"] = nlohmann::ordered_json::array();
  for (std::size_t s = 0; s < t.series.size(); ++s) {
    const GroupLabel& label = t.series[s].label;
    data["series"].push_back({{"label", shown_label(label)},
                              {"placeholder", label.placeholder},
                              {"color", series_color(s, t.series[s].other)},
                              {"peak", t.series[s].peak},
                              {"values", t.series[s].values}});
  }
  // No '<' in the data, so no name can close its <script> element or open a comment or
  // script inside it; '<' stands only inside JSON strings, where \u003c means the same.
  std::string json;
  for (const char c : json_text(data, -1)) {
    if (c == '<')
      json += "\\u003c";
    else
      json += c;
  }

  std::string html = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>";
  html += xml_escape(text.title);
  html += "</title><style>";
  html += kStyle;
  html += "</style></head><body>\n<h1>" + xml_escape(text.title) + "</h1><div class=\"meta\">" +
          xml_escape(text.source) + " - " + std::to_string(t.events) + " events, grouped by " +
          xml_escape(t.grouped_by) + "</div>\n";
  html += "<div id=\"wrap\"><div id=\"chart\"></div><div id=\"legend\"></div></div><div id=\"tip\"></div>\n";
  html +=
      "<noscript>This page draws its chart with JavaScript; `remat-report timeline -o OUT.svg` writes a static "
      "picture.</noscript>\n";
  html += "<script type=\"application/json\" id=\"timeline-data\">" + json + "</script>\n<script>";
  html += kScript;
  html += "</script>\n</body></html>\n";
  return html;
}

}  // namespace remat::report

// SLI charts of the deployment health page (uPlot): requests/s, error ratio and p95 latency,
// one line per slot (stable, canary), from the page's JSON endpoint
// ({x: [unix s], series: {stable: {rps, error_ratio, p95_ms}, ...}}). Ranges: 15m (every
// health check), 1h / 24h / 7d (minute rows). The shown range reloads every 10 s.
(function () {
  "use strict";
  const root = document.querySelector("[data-sli-chart]");
  if (!root || !window.uPlot) return;
  const METRICS = [
    ["rps", "Requests/s"],
    ["error_ratio", "Error ratio"],
    ["p95_ms", "p95 latency (ms)"],
  ];
  const COLORS = { stable: "#2457d6", canary: "#d97706" };
  const SPANS = { "15m": 900, "1h": 3600, "24h": 86400, "7d": 604800 };
  const empty = root.querySelector("[data-chart-empty]");
  let range = "15m";
  let plots = [];
  let shape = "";

  function draw(data) {
    const groups = Object.keys(data.series);
    root.dataset.points = String(data.x.length);
    root.dataset.range = data.range;
    empty.hidden = data.x.length > 0;
    const key = groups.join(",");
    if (!groups.length || key !== shape) {
      plots.forEach(function (p) { p.destroy(); });
      plots = [];
      shape = key;
    }
    if (!groups.length) return;
    METRICS.forEach(function (metric, index) {
      const columns = [data.x].concat(groups.map(function (g) { return data.series[g][metric[0]]; }));
      if (plots[index]) {
        plots[index].setData(columns);
        return;
      }
      const el = root.querySelector('[data-chart="' + metric[0] + '"]');
      const options = {
        title: metric[1],
        width: Math.max(280, el.clientWidth || 320),
        height: 180,
        // The whole selected range, ending now: a few points must not stretch the axis
        // over years (uPlot's auto range around a single point).
        scales: { x: { time: true, range: function () {
          const end = Date.now() / 1000;
          return [end - (SPANS[range] || 900), end];
        } } },
        axes: [{}, { size: 56 }],
        series: [{}].concat(groups.map(function (g) {
          return { label: g, stroke: COLORS[g] || "#555", width: 1.5 };
        })),
      };
      plots[index] = new uPlot(options, columns, el);
    });
  }

  function load() {
    const url = root.dataset.seriesUrl + "?range=" + encodeURIComponent(range);
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (data) { if (data) draw(data); })
      .catch(function (error) { console.warn("health-chart:", error); });
  }

  root.querySelectorAll("[data-range]").forEach(function (button) {
    button.addEventListener("click", function () {
      range = button.dataset.range;
      root.querySelectorAll("[data-range]").forEach(function (b) {
        b.setAttribute("aria-pressed", String(b === button));
      });
      load();
    });
  });
  load();
  setInterval(function () { if (!document.hidden) load(); }, 10000);
})();

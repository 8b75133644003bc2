// The GPU dashboard: one live uPlot chart per GPU the tenant's replicas use (GPU and memory
// utilisation, 5 minutes on screen, pausable), a memory gauge per GPU (the tenant's own
// processes apart), KV cache per deployment, all from /ws/gpu/ (one JSON sample per message,
// each with a `seq`). Reconnects resume from the last sample (`since=<seq>`); close code 4403
// (not a member) stops reconnecting. Simulated samples are marked on every chart.
// The history section loads 15m / 1h / 24h / 7d from the page's JSON endpoint.
(function () {
  "use strict";
  const root = document.querySelector("[data-gpu-live]");
  if (!root || !window.uPlot) return;
  const WINDOW_S = 300;
  const grid = root.querySelector("[data-gpu-grid]");
  const empty = root.querySelector("[data-gpu-empty]");
  const state = root.querySelector("[data-stream-state]");
  const counter = root.querySelector("[data-sample-count]");
  const pauseButton = root.querySelector("[data-pause]");
  const kvRows = root.querySelector("[data-kv-rows]");
  const cards = {}; // uuid -> {plot, data, gauge, label}
  let lastSeq = "";
  let received = 0;
  let paused = false;
  let retry = 500;

  function gib(bytes) { return (bytes / 1073741824).toFixed(1) + " GiB"; }
  function pct(v) { return v == null ? "–" : (v * 100).toFixed(1) + "%"; }

  function setState(name, text) {
    state.dataset.state = name;
    state.textContent = text;
  }

  function card(device, simulated) {
    let c = cards[device.uuid];
    if (c) return c;
    const el = document.createElement("div");
    el.className = "gpu-card";
    el.dataset.testid = "gpu-card";
    el.dataset.uuid = device.uuid;
    el.innerHTML =
      "<h3></h3><div class='muted' data-meta></div>" +
      "<div class='gauge' title='memory used (all processes)'><span></span></div>" +
      "<div class='gauge mine' title='memory used by your replicas'><span></span></div>" +
      "<div class='muted' data-mem></div><div data-chart></div>";
    el.querySelector("h3").textContent = "GPU " + device.index + " · " + device.name + " ";
    if (simulated) {
      const badge = document.createElement("span");
      badge.className = "sim-badge";
      badge.dataset.testid = "gpu-simulated-badge";
      badge.textContent = "SIMULATED";
      el.querySelector("h3").appendChild(badge);
    }
    grid.appendChild(el);
    const data = [[], [], []];
    const plot = new uPlot({
      width: 400, height: 180,
      title: simulated ? "Utilisation (simulated)" : "Utilisation",
      scales: { y: { range: [0, 100] } },
      series: [
        {},
        { label: "GPU %", stroke: "#2457d6" },
        { label: "Memory %", stroke: "#d97706" },
      ],
    }, data, el.querySelector("[data-chart]"));
    c = cards[device.uuid] = { el: el, plot: plot, data: data, points: 0 };
    return c;
  }

  function onSample(sample) {
    received += 1;
    counter.textContent = String(received);
    root.dataset.samples = String(received);
    lastSeq = sample.seq || lastSeq;
    empty.hidden = sample.devices.length > 0;
    const mine = {};
    sample.processes.forEach(function (p) {
      mine[p.device_uuid] = (mine[p.device_uuid] || 0) + p.used_memory;
    });
    sample.devices.forEach(function (d) {
      const c = card(d, sample.simulated);
      c.data[0].push(sample.at);
      c.data[1].push(d.gpu_util);
      c.data[2].push(d.mem_util);
      while (c.data[0].length && c.data[0][0] < sample.at - WINDOW_S) {
        c.data[0].shift(); c.data[1].shift(); c.data[2].shift();
      }
      c.points = c.data[0].length;
      c.el.dataset.points = String(c.points);
      if (!paused) c.plot.setData(c.data);
      const total = d.mem_total || 1;
      c.el.querySelectorAll(".gauge > span")[0].style.width = (100 * d.mem_used / total) + "%";
      c.el.querySelectorAll(".gauge > span")[1].style.width = (100 * (mine[d.uuid] || 0) / total) + "%";
      c.el.querySelector("[data-mem]").textContent =
        gib(d.mem_used) + " of " + gib(d.mem_total) + " used, yours " + gib(mine[d.uuid] || 0) +
        (d.fragmentation == null ? "" : " · largest free block " + gib(d.mem_largest_free || 0) +
          " · fragmentation " + d.fragmentation.toFixed(3) +
          (sample.simulated || d.fragmentation_source === "simulated" ? " (simulated)" : ""));
      c.el.querySelector("[data-meta]").textContent =
        sample.node + " · " + d.temperature_c.toFixed(0) + " °C · " + d.power_w.toFixed(0) +
        " W · SM " + d.sm_clock_mhz.toFixed(0) + " MHz" +
        (d.xid_errors ? " · XID errors " + d.xid_errors : "");
    });
    renderKv(sample.kv || {});
  }

  function renderKv(kv) {
    const names = Object.keys(kv).sort();
    if (!names.length) return;
    kvRows.textContent = "";
    names.forEach(function (name) {
      const replicas = kv[name];
      const total = replicas.reduce(function (s, r) { return s + r.blocks_total; }, 0);
      const used = replicas.reduce(function (s, r) { return s + r.blocks_used; }, 0);
      const queries = replicas.reduce(function (s, r) { return s + r.prefix_queries; }, 0);
      const hits = replicas.reduce(function (s, r) { return s + r.prefix_hits; }, 0);
      const frag = Math.max.apply(null, replicas.map(function (r) { return r.fragmentation; }));
      const pre = replicas.reduce(function (s, r) { return s + r.preemptions; }, 0);
      const tr = document.createElement("tr");
      [name, String(replicas.length), total ? pct(used / total) : "–",
        queries ? pct(hits / queries) : "–", frag.toFixed(3), String(pre)].forEach(function (v) {
        const td = document.createElement("td");
        td.textContent = v;
        tr.appendChild(td);
      });
      kvRows.appendChild(tr);
    });
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    let path = root.dataset.wsPath;
    if (lastSeq) path += "&since=" + encodeURIComponent(lastSeq);
    const ws = new WebSocket(scheme + location.host + path);
    ws.onopen = function () { setState("live", "live"); retry = 500; };
    ws.onmessage = function (event) { onSample(JSON.parse(event.data)); };
    ws.onclose = function (event) {
      if (event.code === 4403) { setState("closed", "refused (not a member)"); return; }
      setState("reconnecting", "reconnecting…");
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 10000);
    };
  }

  pauseButton.addEventListener("click", function () {
    paused = !paused;
    pauseButton.setAttribute("aria-pressed", String(paused));
    pauseButton.textContent = paused ? "Resume" : "Pause";
    if (!paused) Object.values(cards).forEach(function (c) { c.plot.setData(c.data); });
  });
  connect();

  // History from PostgreSQL.
  const history = document.querySelector("[data-gpu-history]");
  let historyPlots = [];
  function loadHistory(range) {
    history.querySelectorAll("[data-range]").forEach(function (b) {
      b.setAttribute("aria-pressed", String(b.dataset.range === range));
    });
    fetch(root.dataset.historyUrl + "?range=" + range, { credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (data) {
        historyPlots.forEach(function (p) { p.destroy(); });
        historyPlots = [];
        const target = history.querySelector("[data-history-grid]");
        target.textContent = "";
        const uuids = Object.keys(data.devices);
        history.querySelector("[data-history-empty]").hidden = uuids.length > 0;
        history.dataset.range = data.range;
        uuids.forEach(function (uuid) {
          const d = data.devices[uuid];
          const el = document.createElement("div");
          el.className = "gpu-card";
          target.appendChild(el);
          historyPlots.push(new uPlot({
            width: 400, height: 180,
            title: d.name + " (" + d.node + ")" + (d.simulated ? " · SIMULATED" : ""),
            scales: { x: { time: true, range: [data.from, data.to] }, y: { range: [0, 100] } },
            series: [{}, { label: "GPU %", stroke: "#2457d6" }, { label: "Memory %", stroke: "#d97706" }],
          }, [d.x, d.gpu_util, d.mem_util], el));
        });
      });
  }
  let historyRange = "1h";
  history.querySelectorAll("[data-range]").forEach(function (b) {
    b.addEventListener("click", function () { historyRange = b.dataset.range; loadHistory(historyRange); });
  });
  loadHistory(historyRange);
  setInterval(function () { if (!document.hidden) loadHistory(historyRange); }, 30000);
})();

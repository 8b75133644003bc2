// Live incident pages. One WebSocket per page to /ws/incidents/?tenant=<slug> (the tenant's
// incident stream). On {"type": "incident.updated", "incident": id} the page re-fetches, with
// htmx, the fragment that shows that incident ([data-incident][data-live-url]); when none
// shows it (a new incident on the list), the table ([data-live-table]). After a reconnect
// everything shown is re-fetched once, since events may have been missed meanwhile.
// Reconnects with exponential backoff and jitter; close code 4403 (not a member) stops it.
(function () {
  "use strict";
  const root = document.querySelector("[data-incidents-live]");
  if (!root || !window.WebSocket || !window.htmx) return;
  const FORBIDDEN = 4403;
  const MIN_DELAY_MS = 1000;
  const MAX_DELAY_MS = 30000;
  const indicator = document.querySelector("[data-live-indicator]");
  const pending = new Map(); // fragment key -> timer: bursts of events become one fetch
  let delay = MIN_DELAY_MS;
  let opened = false;

  function show(state, text) {
    root.dataset.live = state;
    if (indicator) indicator.textContent = text;
  }

  function refetch(key, find) {
    if (pending.has(key)) return;
    pending.set(key, setTimeout(function () {
      pending.delete(key);
      const el = find();
      if (el && el.dataset.liveUrl) {
        htmx.ajax("GET", el.dataset.liveUrl, { target: el, swap: "outerHTML" });
      }
    }, 150));
  }

  function table() {
    return root.querySelector("[data-live-table]");
  }

  function onEvent(message) {
    if (!message || message.type !== "incident.updated") return;
    const selector = '[data-incident="' + Number(message.incident) + '"][data-live-url]';
    if (root.querySelector(selector)) {
      refetch("incident-" + message.incident, function () { return root.querySelector(selector); });
    } else if (table()) {
      refetch("table", table);
    }
  }

  function refetchAll() {
    if (table()) {
      refetch("table", table);
      return;
    }
    root.querySelectorAll("[data-incident][data-live-url]").forEach(function (el) {
      const selector = '[data-incident="' + el.dataset.incident + '"][data-live-url]';
      refetch("incident-" + el.dataset.incident, function () { return root.querySelector(selector); });
    });
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = scheme + "//" + location.host + "/ws/incidents/?tenant=" +
      encodeURIComponent(root.dataset.tenant);
    const socket = new WebSocket(url);
    socket.onopen = function () {
      show("open", "live");
      if (opened) refetchAll();
      opened = true;
      delay = MIN_DELAY_MS;
    };
    socket.onmessage = function (event) {
      try {
        onEvent(JSON.parse(event.data));
      } catch (error) {
        console.warn("incidents-live: bad message", error);
      }
    };
    socket.onclose = function (event) {
      if (event.code === FORBIDDEN) {
        show("forbidden", "not live");
        return;
      }
      show("closed", "reconnecting…");
      setTimeout(connect, delay + Math.random() * delay * 0.3);
      delay = Math.min(delay * 2, MAX_DELAY_MS);
    };
  }

  connect();
})();

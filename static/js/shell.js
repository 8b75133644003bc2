// The shell: the side navigation as a menu on narrow screens (Escape or a click outside
// closes it, focus returns to the button), and the theme button (system -> light -> dark).
(function () {
  "use strict";
  var root = document.documentElement;
  var toggle = document.querySelector("[data-menu-toggle]");
  var sidebar = document.getElementById("sidebar");

  function setOpen(open) {
    document.body.classList.toggle("nav-open", open);
    if (toggle) toggle.setAttribute("aria-expanded", open ? "true" : "false");
  }
  if (toggle && sidebar) {
    toggle.addEventListener("click", function () {
      var open = !document.body.classList.contains("nav-open");
      setOpen(open);
      if (open) { var first = sidebar.querySelector("a"); if (first) first.focus(); }
    });
    document.addEventListener("keydown", function (e) {
      if (e.key === "Escape" && document.body.classList.contains("nav-open")) {
        setOpen(false);
        toggle.focus();
      }
    });
    document.addEventListener("click", function (e) {
      if (!document.body.classList.contains("nav-open")) return;
      if (!sidebar.contains(e.target) && !toggle.contains(e.target)) setOpen(false);
    });
  }
  // The account menu (<details>) closes on Escape and on a click outside, like a menu.
  document.querySelectorAll("details.menu").forEach(function (menu) {
    menu.addEventListener("keydown", function (e) {
      if (e.key === "Escape" && menu.open) { menu.open = false; menu.querySelector("summary").focus(); }
    });
    document.addEventListener("click", function (e) { if (menu.open && !menu.contains(e.target)) menu.open = false; });
  });

  // A region that scrolls sideways (a wide table on a narrow screen) and holds nothing
  // focusable gets a tab stop and a name, so a keyboard can scroll it too.
  var SCROLLERS = ".card, .card > table, table.list, table.kv, table.source, pre";
  var FOCUSABLE = "a[href], button, input, select, textarea, [tabindex]";
  function keyboardScrollers() {
    document.querySelectorAll(SCROLLERS).forEach(function (el) {
      var scrolls = el.scrollWidth > el.clientWidth + 1;
      if (el.dataset.scrollStop === "1" && !scrolls) {
        el.removeAttribute("tabindex");
        delete el.dataset.scrollStop;
        return;
      }
      if (!scrolls || el.dataset.scrollStop === "1" || el.querySelector(FOCUSABLE)) return;
      el.setAttribute("tabindex", "0");
      el.dataset.scrollStop = "1";
      if (!el.hasAttribute("aria-label") && !el.hasAttribute("aria-labelledby")) {
        var heading = el.querySelector("h2, h3, caption") || el.closest(".card") && el.closest(".card").querySelector("h2, h3");
        el.setAttribute("aria-label", (heading ? heading.textContent.trim() : "Table") + " (scrolls sideways)");
      }
    });
  }
  // At once, never later: a check (or a keyboard user) that comes between a resize or a swap
  // and a deferred pass would meet a scrolling table with no tab stop. A resize runs it in the
  // frame's resize steps; new content (an htmx swap, a live stream) in the observer's microtask,
  // before any other task can see it.
  window.addEventListener("resize", keyboardScrollers);
  new MutationObserver(keyboardScrollers).observe(document.body, { childList: true, subtree: true });
  keyboardScrollers();

  var themeButton = document.querySelector("[data-theme-toggle]");
  var ORDER = ["system", "light", "dark"];
  function label(theme) {
    if (!themeButton) return;
    themeButton.setAttribute("aria-label", "Colour theme: " + (theme === "system" ? "follows the system" : theme));
    themeButton.dataset.current = theme;
  }
  if (themeButton) {
    label(root.dataset.theme || "system");
    themeButton.addEventListener("click", function () {
      var now = root.dataset.theme || "system";
      var next = ORDER[(ORDER.indexOf(now) + 1) % ORDER.length];
      if (next === "system") delete root.dataset.theme; else root.dataset.theme = next;
      try {
        if (next === "system") window.localStorage.removeItem("theme");
        else window.localStorage.setItem("theme", next);
      } catch (e) { /* not kept across pages */ }
      label(next);
      document.dispatchEvent(new CustomEvent("portal:theme", { detail: { theme: next } }));
    });
  }
})();

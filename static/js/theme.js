// Runs in <head>, before the page paints: the theme the user picked (localStorage "theme":
// "light" or "dark"; absent: the system's), and the "js" class the narrow-screen menu needs.
(function () {
  "use strict";
  var root = document.documentElement;
  root.classList.add("js");
  try {
    var theme = window.localStorage.getItem("theme");
    if (theme === "light" || theme === "dark") root.dataset.theme = theme;
  } catch (e) { /* storage refused: the system's theme */ }
})();

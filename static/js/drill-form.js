// The drill form shows the chosen fault's parameters only: the other faults' fieldsets are
// hidden and disabled (not submitted). Without this script every fieldset shows, and the
// server reads the chosen fault's values only.
(function () {
  "use strict";
  var form = document.querySelector("form.drill-form");
  if (!form) return;
  var select = form.querySelector('select[name="fault"]');
  function show() {
    form.querySelectorAll("fieldset.fault-params").forEach(function (fs) {
      var mine = fs.dataset.fault === select.value;
      fs.hidden = !mine;
      fs.disabled = !mine;
    });
  }
  select.addEventListener("change", show);
  show();
})();

// The contract editor: CodeMirror 5 with YAML highlighting and line numbers in place of the
// textarea (which it keeps in step, so the form posts as before), and the portal's own check
// as you type: 400 ms after the last keystroke the source goes to the check URL (the same
// parser and schema as saving, nothing saved) and each problem is marked on its line, listed
// under the editor (a click goes to the line) and announced politely to screen readers.
// Without JavaScript the textarea stays and the check runs on save.
(function () {
  "use strict";
  var area = document.querySelector("textarea[data-contract-editor]");
  if (!area || !window.CodeMirror) return;
  var status = document.querySelector("[data-contract-status]");
  var list = document.querySelector("[data-contract-problems]");
  var url = area.dataset.checkUrl;
  var csrf = (document.querySelector("input[name=csrfmiddlewaretoken]") || {}).value || "";
  var seq = 0;

  var editor = CodeMirror.fromTextArea(area, {
    mode: "yaml",
    inputStyle: "contenteditable", // the text itself is the input: screen readers read it
    lineNumbers: true,
    indentUnit: 2,
    tabSize: 2,
    extraKeys: { Tab: function (cm) { cm.replaceSelection("  "); }, "Shift-Tab": false },
    gutters: ["CodeMirror-lint-markers", "CodeMirror-linenumbers"],
    screenReaderLabel: area.getAttribute("aria-label") || "Contract (YAML)",
    lint: { getAnnotations: check, async: true, delay: 400 },
  });
  editor.on("change", function () { editor.save(); });

  function show(problems) {
    if (status) {
      status.dataset.state = problems.length ? "invalid" : "valid";
      status.textContent = problems.length
        ? problems.length + " problem" + (problems.length === 1 ? "" : "s") + " in the contract"
        : "The contract is valid.";
    }
    if (!list) return;
    list.replaceChildren();
    problems.forEach(function (p) {
      var li = document.createElement("li");
      var text = (p.line ? "line " + p.line + " — " : "") + (p.field ? p.field + " — " : "") + p.message;
      if (p.line) {
        var button = document.createElement("button");
        button.type = "button";
        button.className = "linkish";
        button.textContent = text;
        button.addEventListener("click", function () {
          editor.focus();
          editor.setCursor({ line: p.line - 1, ch: 0 });
        });
        li.appendChild(button);
      } else {
        li.textContent = text;
      }
      list.appendChild(li);
    });
  }

  function check(text, updateLinting, options, cm) {
    var mine = ++seq;
    var body = new URLSearchParams();
    body.set("source", text);
    fetch(url, {
      method: "POST",
      body: body,
      headers: { "X-CSRFToken": csrf },
      credentials: "same-origin",
    })
      .then(function (r) { return r.json(); })
      .then(function (result) {
        if (mine !== seq) return; // a newer check is on its way
        var problems = result.errors || [];
        show(problems);
        updateLinting(cm, problems.map(function (p) {
          var line = Math.max(0, Math.min((p.line || 1) - 1, cm.lineCount() - 1));
          return {
            from: CodeMirror.Pos(line, 0),
            to: CodeMirror.Pos(line, cm.getLine(line).length),
            message: (p.field ? p.field + ": " : "") + p.message,
            severity: "error",
          };
        }));
      })
      .catch(function () {
        if (status) { status.dataset.state = "unknown"; status.textContent = "Could not check just now; saving checks again."; }
      });
  }
})();

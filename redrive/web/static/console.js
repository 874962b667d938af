// The console's own few lines. Every page works without them: forms post, links load, and
// the operations pages have a Reload link. With them, an element with data-poll="PATH" is
// replaced every data-every seconds by PATH's HTML (the server's own rendering, escaped as
// every page is), so running operations show their progress live; and an operation's page
// (data-operation="PATH", the operation's JSON) shows its state and counts as they change,
// set as text, never as markup, until the operation ends. Polling rather than server-sent
// events: the counts change once a batch, so a GET every two seconds of the documented JSON
// is enough, holds no connection open per tab, and passes any proxy in front unchanged.
"use strict";
(function () {
  function every(box) {
    return Math.max(2, Number(box.getAttribute("data-every")) || 5) * 1000;
  }
  function poll(box) {
    function again() {
      fetch(box.getAttribute("data-poll"), { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (answer) { return answer.ok ? answer.text() : null; })
        .then(function (html) { if (html !== null) { box.innerHTML = html; } })
        .catch(function () {})
        .then(function () { setTimeout(again, every(box)); });
    }
    setTimeout(again, every(box));
  }
  function fill(box, texts, kind) {
    box.textContent = "";
    texts.forEach(function (text) {
      var line = document.createElement(kind);
      line.textContent = text;
      if (kind === "p") { line.className = "problem"; }
      box.appendChild(line);
    });
  }
  function show(box, op) {
    var counts = op.result || op.progress || {};
    var list = box.querySelector("[data-counts]");
    var keys = list.getAttribute("data-counts").split(" ").filter(function (k) { return counts[k] != null; });
    fill(list, keys.map(function (k) {
      var n = counts[k];
      return k + ": " + (Number.isInteger(n) ? n.toLocaleString("en-US") : String(n));
    }), "li");
    box.querySelector("[data-field=state]").textContent = op.state;
    var error = box.querySelector("[data-field=error]");
    error.textContent = op.error || "";
    error.hidden = !op.error;
    fill(box.querySelector("[data-field=problems]"), op.problems, "p");
    if (op.state === "running") { return true; }
    // Ended: nothing more to poll, nothing left to stop.
    box.removeAttribute("data-operation");
    box.querySelectorAll("[data-while-running]").forEach(function (e) { e.remove(); });
    return false;
  }
  function follow(box) {
    function again() {
      fetch(box.getAttribute("data-operation"), { credentials: "same-origin", headers: { "Accept": "application/json" } })
        .then(function (answer) { return answer.ok ? answer.json() : null; })
        .then(function (op) { return op === null || show(box, op); })
        .catch(function () { return true; })
        .then(function (going) { if (going) { setTimeout(again, every(box)); } });
    }
    setTimeout(again, every(box));
  }
  document.querySelectorAll("[data-poll]").forEach(poll);
  document.querySelectorAll("[data-operation]").forEach(follow);
})();

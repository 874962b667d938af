// The console's own few lines. Every page works without them: forms post, links load, and
// the operations page has a Refresh link. With them, an element with data-poll="PATH"
// is replaced every data-every seconds by PATH's HTML (the server's own rendering, escaped
// as every page is), so running operations show their progress live.
"use strict";
(function () {
  function poll(box) {
    var every = Math.max(2, Number(box.getAttribute("data-every")) || 5) * 1000;
    function again() {
      fetch(box.getAttribute("data-poll"), { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (answer) { return answer.ok ? answer.text() : null; })
        .then(function (html) { if (html !== null) { box.innerHTML = html; } })
        .catch(function () {})
        .then(function () { setTimeout(again, every); });
    }
    setTimeout(again, every);
  }
  document.querySelectorAll("[data-poll]").forEach(poll);
})();

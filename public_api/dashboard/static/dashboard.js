// Live updates: a page marked data-live listens to the server's event stream and, when a new
// push message arrives (a pallet, an exception's change, ...), fetches itself again and swaps in
// the new <main> and the navigation's open-exceptions count. No other script.
(function () {
  "use strict";
  var main = document.getElementById("main");
  // The badge is inside <main>, which a refresh replaces: look it up each time.
  function setStatus(text) {
    var status = document.getElementById("live-status");
    if (status) status.textContent = text;
  }
  if (!main || !main.dataset.live || !window.EventSource) {
    setStatus("Live updates unavailable: reload to refresh");
    return;
  }
  var busy = false;
  var again = false;

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (response.redirected || !response.ok) throw new Error("reload");
        return response.text();
      })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("main");
        if (!fresh) return;
        var focused = document.activeElement && document.activeElement.id;
        var typed = {};  // notes being written survive the swap
        main.querySelectorAll("textarea[id], input[type=text][id], input[type=number][id]").forEach(function (field) {
          if (field.value) typed[field.id] = field.value;
        });
        main.innerHTML = fresh.innerHTML;
        Object.keys(typed).forEach(function (id) {
          var field = document.getElementById(id);
          if (field) field.value = typed[id];
        });
        if (focused) { var el = document.getElementById(focused); if (el) el.focus(); }
        var count = document.getElementById("nav-open-exceptions");
        var freshCount = doc.getElementById("nav-open-exceptions");
        if (count && freshCount) {
          count.innerHTML = freshCount.innerHTML;
          count.className = freshCount.className;
        }
        setStatus("Live: updated " + new Date().toLocaleTimeString());
        document.dispatchEvent(new CustomEvent("dockflow:refreshed"));
      })
      .catch(function () { window.location.reload(); })
      .then(function () {
        busy = false;
        if (again) { again = false; refresh(); }
      });
  }

  var source = new EventSource(main.dataset.live);
  source.addEventListener("refresh", refresh);
  source.addEventListener("open", function () {
    setStatus("Live updates on");
  });
  source.addEventListener("error", function () {
    setStatus("Live updates reconnecting…");
  });
  window.addEventListener("pagehide", function () { source.close(); });
})();

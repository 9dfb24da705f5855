// sqlq dashboard: refresh the page's live region about once a second, only while
// the tab is visible. htmx does the request and the swap (hx-trigger="sqlq:tick");
// this file only decides when. No inline script anywhere: the pages' CSP allows
// only files served by sqlq itself.
(function () {
  "use strict";
  var sent = 0;

  function tick() {
    if (document.hidden || typeof htmx === "undefined") {
      return false;
    }
    document.querySelectorAll("[data-live]").forEach(function (el) {
      htmx.trigger(el, "sqlq:tick");
    });
    return true;
  }

  document.addEventListener("htmx:beforeRequest", function () {
    sent += 1;
  });
  // A refresh replaces the live region, folds and all: a traceback the reader opened (or
  // closed) stays so. Each <details> with an id is put back as it was before the swap;
  // one the swap brought new keeps the page's default.
  var folds = null;
  document.addEventListener("htmx:beforeSwap", function () {
    folds = {};
    document.querySelectorAll("details[id]").forEach(function (d) {
      folds[d.id] = d.open;
    });
  });
  document.addEventListener("htmx:afterSettle", function () {
    if (folds === null) {
      return;
    }
    var kept = folds;
    folds = null;
    document.querySelectorAll("details[id]").forEach(function (d) {
      if (Object.prototype.hasOwnProperty.call(kept, d.id)) {
        d.open = kept[d.id];
      }
    });
  });
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) {
      tick();
    }
  });
  // For the browser tests: tick() on demand, and how many refreshes were sent.
  window.sqlqLive = {
    tick: tick,
    sent: function () {
      return sent;
    },
  };
  setInterval(tick, 1000);
})();

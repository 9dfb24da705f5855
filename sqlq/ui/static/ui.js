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

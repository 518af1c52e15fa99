/* Switchboard board: progressive enhancement only; every page works without this file.
   1. Remember the viewer's time zone in a cookie, so "resets at" shows their wall clock
      (UTC until then, and always without JavaScript); reload once when it was missing.
   2. Copy buttons for the one-time agent token and its MCP client configuration.
   3. Mark a live queue page while its SSE stream is open (htmx's sse extension does the rest). */
(function () {
  "use strict";
  var zone = "";
  try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (e) { zone = ""; }
  var match = document.cookie.match(/(?:^|;\s*)tz=([^;]*)/);
  var current = match ? decodeURIComponent(match[1]) : "";
  if (zone && zone !== current) {
    document.cookie = "tz=" + encodeURIComponent(zone) + "; path=/; max-age=31536000; SameSite=Lax";
    var onTokenPage = document.getElementById("agent-token");
    if (!onTokenPage && !sessionStorage.getItem("sb-tz-reloaded")) {
      sessionStorage.setItem("sb-tz-reloaded", "1");
      location.reload();
    }
  }
  document.addEventListener("htmx:sseOpen", function (event) {
    event.target.setAttribute("data-live", "open");
  });
  document.addEventListener("htmx:sseError", function (event) {
    event.target.setAttribute("data-live", "retrying");
  });
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("button.copy[data-copy]").forEach(function (button) {
      button.hidden = false;
      button.addEventListener("click", function () {
        var source = document.querySelector(button.getAttribute("data-copy"));
        if (!source || !navigator.clipboard) { return; }
        navigator.clipboard.writeText(source.textContent.trim()).then(function () {
          var label = button.textContent;
          button.textContent = "Copied ✓";
          setTimeout(function () { button.textContent = label; }, 1500);
        });
      });
    });
  });
})();

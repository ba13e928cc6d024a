/* worldcell console: the live-refresh switch of htmx-polled fragments (docs/console.md "Live pages").
   A switch <div class="wc-live" data-live-key="K"> pauses every element polling with
   hx-trigger="every Ns [wcLiveOn('K', this)]"; the paused state is kept in localStorage per key.
   While paused, or while the tab is hidden, or while rows of the form are ticked, nothing polls. */
(function () {
  "use strict";
  var PREFIX = "worldcell.live.paused.";
  function paused(key) {
    try { return window.localStorage.getItem(PREFIX + key) === "1"; } catch (e) { return false; }
  }
  function setPaused(key, on) {
    try { if (on) { window.localStorage.setItem(PREFIX + key, "1"); } else { window.localStorage.removeItem(PREFIX + key); } } catch (e) { /* private mode: per page only */ }
  }
  function paint(el) {
    var key = el.getAttribute("data-live-key"), off = paused(key);
    el.classList.toggle("wc-paused", off);
    var state = el.querySelector(".wc-live-state"), button = el.querySelector("button");
    if (state) { state.textContent = off ? "paused" : "live · refreshes every " + el.getAttribute("data-live-every"); }
    if (button) { button.textContent = off ? "resume" : "pause"; button.setAttribute("aria-pressed", off ? "true" : "false"); }
  }
  window.wcLiveOn = function (key, el) {
    if (paused(key) || document.hidden) { return false; }
    var form = el && el.closest ? el.closest("form") : null;
    if (form && form.querySelector("input.action-select:checked")) { return false; }
    return true;
  };
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll(".wc-live[data-live-key]").forEach(function (el) {
      paint(el);
      var button = el.querySelector("button");
      if (button) {
        button.addEventListener("click", function () {
          setPaused(el.getAttribute("data-live-key"), !paused(el.getAttribute("data-live-key")));
          paint(el);
        });
      }
    });
  });
})();

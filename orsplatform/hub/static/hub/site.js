/* The site's only script, served locally: chart tooltips and zoom, copy buttons, live figures.
   Every page works without it; it only adds to what the server rendered. */
(function () {
  "use strict";

  // Chart tooltips: each data mark carries its value in a <title>; show it at once, styled.
  function tooltips(root) {
    root.querySelectorAll("figure.chart-card").forEach(function (card) {
      if (card.dataset.tips) return;
      card.dataset.tips = "1";
      var tip = document.createElement("div");
      tip.className = "chart-tip";
      tip.hidden = true;
      card.appendChild(tip);
      card.addEventListener("mouseover", function (e) {
        var mark = e.target.closest(".mark");
        if (!mark) return;
        var title = mark.querySelector("title");
        tip.textContent = title ? title.textContent : mark.dataset.value;
        var box = mark.getBoundingClientRect(), cbox = card.getBoundingClientRect();
        tip.style.left = (box.left + box.width / 2 - cbox.left) + "px";
        tip.style.top = (box.top - cbox.top) + "px";
        tip.hidden = false;
      });
      card.addEventListener("mouseout", function (e) {
        if (e.target.closest(".mark")) tip.hidden = true;
      });
      // Zoom: a point of a time series opens the range of its own period.
      card.addEventListener("click", function (e) {
        var mark = e.target.closest(".mark[data-start]");
        if (!mark) return;
        var url = new URL(window.location.href);
        url.searchParams.delete("range");
        url.searchParams.delete("page");
        url.searchParams.set("start", mark.dataset.start);
        url.searchParams.set("end", mark.dataset.end);
        window.location.href = url.toString();
      });
    });
  }

  // Copy buttons (snippets, the one-time API key): the Clipboard API where the page is a secure context
  // (https, localhost); elsewhere the text is selected and copied the old way, and if even that is
  // refused it stays selected for Ctrl+C. The button says which happened.
  function selectText(el) {
    var range = document.createRange();
    range.selectNodeContents(el);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  function copyButtons() {
    document.querySelectorAll("button[data-copy]").forEach(function (button) {
      var label = button.textContent;
      button.addEventListener("click", function () {
        var source = document.getElementById(button.dataset.copy);
        var text = source.textContent;
        var say = function (what) {
          button.textContent = what;
          button.dataset.copied = what;
          setTimeout(function () { button.textContent = label; }, 1500);
        };
        var fallback = function () {
          selectText(source);
          var ok = false;
          try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
          say(ok ? "Copied" : "Press Ctrl+C");
        };
        if (navigator.clipboard && window.isSecureContext) {
          navigator.clipboard.writeText(text).then(function () { say("Copied"); }, fallback);
        } else {
          fallback();
        }
      });
    });
  }

  // Live figures: a region marked data-live="true" (a run is in progress) is refetched and swapped
  // in place every few seconds, until the server says nothing is running any more.
  function live() {
    var region = document.querySelector("[data-live]");
    if (!region || region.dataset.live !== "true") return;
    var every = parseInt(region.dataset.liveSeconds || "10", 10) * 1000;
    var timer = setInterval(function () {
      fetch(window.location.href, { headers: { "X-Live-Refresh": "1" }, credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (!html) return;
          var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("[data-live]");
          if (!fresh) return;
          region.innerHTML = fresh.innerHTML;
          region.dataset.live = fresh.dataset.live;
          region.dataset.refreshed = String((parseInt(region.dataset.refreshed || "0", 10)) + 1);
          tooltips(region);
          if (fresh.dataset.live !== "true") clearInterval(timer);
        })
        .catch(function () {});
    }, every);
  }

  document.addEventListener("DOMContentLoaded", function () {
    tooltips(document);
    copyButtons();
    live();
  });
})();

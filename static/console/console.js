// The console's small script: live updates over WebSockets, with polling as the fallback.
// No build step. Everything received is rendered with textContent: model output is untrusted.
(function () {
  "use strict";

  var POLL_MS = 5000;

  function flash(text, kind) {
    var box = document.getElementById("flash");
    if (!box) return;
    var p = document.createElement("p");
    p.className = "flash " + (kind || "error");
    p.textContent = text;
    box.appendChild(p);
    setTimeout(function () { p.remove(); }, 8000);
  }

  // -- relative times ("3 min ago"), refreshed in place ------------------------------------
  function ago(iso) {
    var s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (s < 60) return s + " s ago";
    if (s < 3600) return Math.floor(s / 60) + " min ago";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min ago";
    return Math.floor(s / 86400) + " d ago";
  }
  function tickTimes() {
    document.querySelectorAll("time[data-ago]").forEach(function (el) {
      var iso = el.getAttribute("datetime");
      if (iso) el.textContent = ago(iso);
    });
  }

  // -- refreshes that never wipe what a person is typing -----------------------------------
  function editing(el) {
    if (el.querySelector(".htmx-request")) return true;  // an answer is on its way
    var active = document.activeElement;
    if (active && el.contains(active) && active.closest("form")) return true;
    return !!el.querySelector("form[data-dirty]");
  }
  function refresh(el) {
    if (!el || !window.htmx) return;
    if (editing(el)) { el.dataset.pending = "1"; return; }
    htmx.ajax("GET", el.getAttribute("hx-get"), { source: el, target: el, swap: "outerHTML" });
  }
  function flushPending() {
    document.querySelectorAll("[data-pending]").forEach(function (el) {
      if (!editing(el)) { delete el.dataset.pending; refresh(el); }
    });
  }
  document.addEventListener("input", function (e) {
    var form = e.target.closest && e.target.closest("form");
    if (form) form.dataset.dirty = "1";
  });
  document.addEventListener("focusout", function () { setTimeout(flushPending, 50); });
  document.addEventListener("htmx:afterSettle", function () { setTimeout(flushPending, 50); });
  document.addEventListener("htmx:beforeRequest", function (e) {
    var el = e.detail.elt;
    if (el && el.hasAttribute && el.hasAttribute("data-keep-when-editing") &&
        e.detail.requestConfig && e.detail.requestConfig.verb === "get" && editing(el)) {
      e.preventDefault();
      el.dataset.pending = "1";
    }
  });
  document.addEventListener("htmx:responseError", function (e) {
    flash("The server answered " + e.detail.xhr.status + ". Reload the page and try again.");
  });
  document.addEventListener("htmx:sendError", function () {
    flash("The server cannot be reached. Your action was not sent.");
  });
  document.addEventListener("htmx:afterSwap", tickTimes);
  // An answered card may vanish at the next list refresh, even before its own answer is
  // swapped in: take the notice from the answer itself and keep it in the flash area.
  document.addEventListener("htmx:afterRequest", function (e) {
    if (!e.detail.successful || !e.detail.xhr) return;
    var doc = new DOMParser().parseFromString(e.detail.xhr.responseText || "", "text/html");
    var notice = doc.querySelector(".ticket-card.done .notice");
    if (notice) flash(notice.textContent, "success");
  });

  // -- a WebSocket that reconnects, and polls while it is down -----------------------------
  function socket(path, handlers) {
    var delay = 1000, poll = null;
    var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + path;
    function startPoll() {
      if (poll === null && handlers.onPoll) poll = setInterval(handlers.onPoll, POLL_MS);
    }
    function stopPoll() { if (poll !== null) { clearInterval(poll); poll = null; } }
    function open() {
      var ws;
      try { ws = new WebSocket(url); } catch (err) { startPoll(); return; }
      ws.onopen = function () { delay = 1000; stopPoll(); status("live", "Live: connected."); };
      ws.onmessage = function (e) {
        var data;
        try { data = JSON.parse(e.data); } catch (err) { return; }
        handlers.onMessage(data);
      };
      ws.onclose = function (e) {
        if (e.code === 4404) { status("down", "This run does not exist."); return; }
        status("down", "Disconnected: reconnecting; committed state is polled meanwhile.");
        startPoll();
        setTimeout(open, delay);
        delay = Math.min(delay * 2, 15000);
      };
    }
    open();
  }
  function status(kind, text) {
    document.querySelectorAll("[data-live-status]").forEach(function (el) {
      el.textContent = text;
      el.dataset.conn = kind;
    });
  }

  // -- lists: runs and inbox refresh when any run commits ----------------------------------
  function startLists() {
    if (!document.querySelector("#listing, #tickets")) return;
    var fire = function () { htmx.trigger(document.body, "rt:commit"); };
    socket("/ws/runs/", {
      onMessage: function (m) { if (m.event === "commit") fire(); },
      onPoll: function () { htmx.trigger(document.body, "rt:poll"); },
    });
  }

  // -- the run page: committed panels plus the live, unconfirmed stream --------------------
  function startRun(panel) {
    var live = { step: 0, attempt: 0, text: "", tools: [] };
    var textEl = document.getElementById("live-text");
    var toolsEl = document.getElementById("live-tools");
    var stepEl = document.getElementById("live-step");
    function committed() { return document.getElementById("committed"); }
    function clear(note) {
      live.text = "";
      live.tools = [];
      stepEl.textContent = note || "";
      render();
    }
    function render() {
      textEl.textContent = live.text;
      textEl.hidden = !live.text;
      toolsEl.textContent = "";
      live.tools.forEach(function (t, i) {
        if (!t) return;
        var li = document.createElement("li");
        var head = document.createElement("b");
        head.textContent = "#" + i + " " + (t.name || "(tool)");
        var pre = document.createElement("pre");
        pre.className = "untrusted";
        pre.textContent = t.args;
        li.appendChild(head);
        li.appendChild(pre);
        toolsEl.appendChild(li);
      });
      panel.classList.toggle("streaming", !!(live.text || live.tools.length));
    }
    function onDelta(d) {
      if (d.step < live.step || (d.step === live.step && d.attempt < live.attempt)) return;
      if (d.step !== live.step || d.attempt !== live.attempt) {
        var failed = d.step === live.step && d.attempt > live.attempt;
        live.step = d.step;
        live.attempt = d.attempt;
        clear((failed ? "Attempt " + (d.attempt - 1) + " failed; its text was dropped. " : "") +
              "Step " + d.step + ", attempt " + d.attempt + " (unconfirmed)");
      }
      if (d.kind === "text") {
        live.text += d.text || "";
      } else if (d.kind === "tool_call") {
        var t = live.tools[d.index] || (live.tools[d.index] = { name: "", args: "" });
        if (d.name) t.name = d.name;
        t.args += d.text || "";
      }
      render();
    }
    socket(panel.dataset.wsPath, {
      onMessage: function (m) {
        if (m.event === "hello") {
          // Committed state first: a page that missed commits while away refreshes now.
          clear("");
          var c = committed();
          if (c && String(m.version) !== c.dataset.version) refresh(c);
        } else if (m.event === "delta") {
          onDelta(m);
        } else if (m.event === "commit") {
          clear("Commit #" + m.seq + " landed; committed state refreshed.");
          refresh(committed());
        }
      },
      onPoll: function () { refresh(committed()); },
    });
    render();
  }

  document.addEventListener("DOMContentLoaded", function () {
    tickTimes();
    setInterval(tickTimes, 10000);
    document.querySelectorAll("input.token").forEach(function (el) {
      el.addEventListener("focus", function () { el.select(); });
    });
    var panel = document.getElementById("live");
    if (panel) startRun(panel);
    startLists();
  });
})();

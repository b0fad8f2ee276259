// The console's small script: live updates over WebSockets, with polling as the fallback.
// No build step. Everything received is rendered with textContent: model output is untrusted.
(function () {
  "use strict";

  var POLL_MS = 5000;
  var INTERRUPTED_MS = 5000;  // no delta for this long while streaming: say so
  var GAP_MARK = " … ";  // drawn where deltas were missed (see docs/live.md)
  var MID_MARK = "… ";  // drawn first when the stream was joined after its opening words

  function flash(text, kind) {
    var box = document.getElementById("flash");
    if (!box) return;
    var p = document.createElement("p");
    p.className = "flash " + (kind || "error");
    p.textContent = text;
    box.appendChild(p);
    setTimeout(function () { p.remove(); }, 8000);
  }

  // -- times: the browser's zone, named; relative on request -------------------------------
  function ago(iso) {
    var s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (s < 60) return s + " s ago";
    if (s < 3600) return Math.floor(s / 60) + " min ago";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min ago";
    return Math.floor(s / 86400) + " d ago";
  }
  var LOCAL = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
    second: "2-digit", hourCycle: "h23", timeZoneName: "short",
  });
  function local(iso) {
    var parts = {};
    LOCAL.formatToParts(new Date(iso)).forEach(function (p) { parts[p.type] = p.value; });
    return parts.year + "-" + parts.month + "-" + parts.day + " " + parts.hour + ":" +
      parts.minute + ":" + parts.second + " " + parts.timeZoneName;
  }
  function relativeWanted() { return localStorage.getItem("rt:relative-times") === "1"; }
  function tickTimes() {
    var relative = relativeWanted();
    document.querySelectorAll("time[data-ago]").forEach(function (el) {
      var iso = el.getAttribute("datetime");
      if (iso) el.textContent = ago(iso);
    });
    document.querySelectorAll("time[data-local]").forEach(function (el) {
      var iso = el.getAttribute("datetime");
      if (!iso) return;
      var absolute = local(iso);
      el.textContent = relative ? ago(iso) : absolute;
      el.title = (relative ? absolute : ago(iso)) + " · " + iso.replace("T", " ").slice(0, 19) + " UTC";
    });
    document.querySelectorAll("[data-time-toggle]").forEach(function (b) {
      b.textContent = relative ? "Show clock times" : "Show relative times";
    });
  }
  document.addEventListener("click", function (e) {
    if (e.target.closest && e.target.closest("[data-time-toggle]")) {
      localStorage.setItem("rt:relative-times", relativeWanted() ? "0" : "1");
      tickTimes();
    }
  });

  // -- copy buttons, and links into folded sections ---------------------------------------
  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("[data-copy]");
    if (!button) return;
    var text = button.getAttribute("data-copy");
    var said = function () {
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = "Copy"; }, 1500);
    };
    if (navigator.clipboard) navigator.clipboard.writeText(text).then(said, function () {});
  });
  function unfold() {
    var id = decodeURIComponent(location.hash.slice(1));
    var target = id && document.getElementById(id);
    for (var el = target; el; el = el.parentElement) {
      if (el.tagName === "DETAILS") el.open = true;
    }
    if (target) target.scrollIntoView();
  }
  window.addEventListener("hashchange", unfold);

  // -- refreshes that never wipe what a person is typing -----------------------------------
  function editing(el) {
    if (el.querySelector(".htmx-request")) return true;  // an answer is on its way
    var active = document.activeElement;
    if (active && el.contains(active) && active.closest("form")) return true;
    return !!el.querySelector("form[data-dirty]");
  }
  // Background reads in flight, by element id: "again" when another was asked for meanwhile.
  // htmx would queue that one, then drop it, since the answer in flight replaces (outerHTML)
  // the element it was queued for: a commit announced during a refresh would never be shown.
  var reading = {};
  function refresh(el) {
    if (!el || !window.htmx) return;
    if (editing(el)) { el.dataset.pending = "1"; return; }
    var id = el.id;
    if (id && reading[id]) { reading[id] = "again"; return; }
    if (id) reading[id] = "once";
    // A background read: a failure is reported by the status line, never thrown.
    var done = htmx.ajax("GET", el.getAttribute("hx-get"),
                         { source: el, target: el, swap: "outerHTML" });
    function settled() {
      if (!id) return;
      var again = reading[id] === "again";
      delete reading[id];
      if (again) refresh(document.getElementById(id));  // the element that replaced it
    }
    if (done && done.then) done.then(settled, settled);
    else settled();
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
  // Only what a person sent is reported as "not sent"; background reads (GET) that fail are
  // shown by the live status line, which already says the server is unreachable.
  function background(e) {
    var config = e.detail.requestConfig;
    return !config || config.verb === "get";
  }
  document.addEventListener("htmx:responseError", function (e) {
    if (background(e)) return;
    flash("The server answered " + e.detail.xhr.status + ". Reload the page and try again.");
  });
  document.addEventListener("htmx:sendError", function (e) {
    if (background(e)) {
      suspend();
      return;
    }
    flash("The server cannot be reached. Your action was not sent.");
  });

  // -- an unreachable server: one quiet probe instead of every background read ---------------
  // Each failed htmx request logs an error, and every list, counter and panel polls: while
  // the server is down, background reads are held and one probe asks every PROBE_MS; the
  // moment it answers, the reads resume and the live socket reconnects (issue 22, 8).
  var PROBE_MS = 2000;
  var reachable = true, probing = null;
  function suspend() {
    status("down", "The server cannot be reached; retrying every " + PROBE_MS / 1000 + " s.");
    if (!reachable) return;
    reachable = false;
    probing = setInterval(probe, PROBE_MS);
  }
  function probe() {
    fetch(document.body.dataset.probeUrl, { cache: "no-store", credentials: "same-origin" }).then(function () {
      if (reachable) return;
      reachable = true;
      clearInterval(probing);
      probing = null;
      status("live", "The server answers again; reconnecting the live feed…");
      document.dispatchEvent(new Event("rt:reachable"));
      htmx.trigger(document.body, "rt:poll");
    }, function () {});
  }
  document.addEventListener("htmx:beforeRequest", function (e) {
    if (!reachable && background(e)) e.preventDefault();
  });
  document.addEventListener("htmx:afterSwap", tickTimes);

  // -- boxes of untrusted text that scroll take the keyboard's focus ------------------------
  // A pre.untrusted is capped in height (console.css); when its text is taller or wider, a
  // keyboard user must be able to focus it to scroll it (axe-core's
  // scrollable-region-focusable): it becomes a named group in the tab order, named by its
  // data-label, else by its box's .io-label, else "Scrolling text". A box that fits stays
  // out of the tab order.
  function markScrollers() {
    document.querySelectorAll("pre.untrusted").forEach(function (el) {
      var scrolls = el.scrollHeight > el.clientHeight + 1 || el.scrollWidth > el.clientWidth + 1;
      if (scrolls === el.hasAttribute("data-scrolls")) return;
      if (!scrolls) {
        ["data-scrolls", "tabindex", "role", "aria-label"].forEach(function (a) { el.removeAttribute(a); });
        return;
      }
      var label = el.dataset.label;
      if (!label) {
        var io = el.parentElement && el.parentElement.querySelector(".io-label");
        label = io ? io.textContent.trim().replace(/\s+/g, " ") : "Scrolling text";
      }
      el.setAttribute("data-scrolls", "");
      el.setAttribute("tabindex", "0");
      el.setAttribute("role", "group");
      el.setAttribute("aria-label", label);
    });
  }
  document.addEventListener("DOMContentLoaded", markScrollers);
  document.addEventListener("htmx:afterSettle", markScrollers);
  document.addEventListener("toggle", markScrollers, true);  // a <details> opened
  window.addEventListener("resize", markScrollers);

  // -- inbox: answered cards stay in place, keep their height, and take the focus ----------
  var heights = {};
  document.addEventListener("htmx:beforeSwap", function (e) {
    var target = e.detail.target;
    if (target && target.classList && target.classList.contains("ticket-card")) {
      heights[target.id] = target.offsetHeight;
    }
  });
  document.addEventListener("htmx:afterSwap", function (e) {
    var id = e.detail.target && e.detail.target.id;
    var card = id && heights[id] !== undefined ? document.getElementById(id) : null;
    if (!card) return;
    // The card never shrinks under the pointer: what sits below it stays where it was.
    card.style.minHeight = heights[id] + "px";
    delete heights[id];
    var outcome = card.querySelector("[data-outcome], .error");
    if (outcome) { outcome.setAttribute("tabindex", "-1"); outcome.focus(); }
    updateSelected();
  });
  document.addEventListener("click", function (e) {
    var dismiss = e.target.closest && e.target.closest("[data-dismiss-card]");
    if (dismiss) {
      var card = dismiss.closest(".ticket-card");
      var next = nextCard(card, 1) || nextCard(card, -1);
      card.remove();
      if (next) next.focus();
    }
    var cancel = e.target.closest && e.target.closest("[data-dismiss-confirm]");
    if (cancel) {
      var box = cancel.closest("#bulk-confirm, .confirm");
      if (box) box.textContent = "";
    }
  });
  function updateSelected() {
    var n = document.querySelectorAll("#tickets input.select:checked").length;
    document.querySelectorAll("[data-testid=selected-count]").forEach(function (el) {
      el.textContent = String(n);
    });
    var r = document.querySelectorAll("#calls input.rc-select:checked").length;
    document.querySelectorAll("[data-testid=rc-selected-count]").forEach(function (el) {
      el.textContent = String(r);
    });
  }
  document.addEventListener("change", function (e) {
    var all = e.target.matches && e.target.matches("[data-select-all]");
    if (all) {
      document.querySelectorAll("#calls input.rc-select").forEach(function (b) { b.checked = e.target.checked; });
    }
    if (all || (e.target.matches && e.target.matches("input.select"))) updateSelected();
    // A select whose options say something (the fork form's step): show what the chosen one says.
    var said = e.target.matches && e.target.matches("select[data-statement-of]");
    if (said) {
      var chosen = e.target.options[e.target.selectedIndex];
      var into = document.getElementById(e.target.getAttribute("data-statement-of"));
      if (chosen && into) into.textContent = chosen.getAttribute("data-statement") || "";
    }
  });
  // A bulk answer swaps the cards it answered (out of band): the count follows what is
  // still selected, never the number sent.
  document.addEventListener("htmx:afterSettle", updateSelected);

  function cards() { return Array.prototype.slice.call(document.querySelectorAll("#tickets .ticket-card")); }
  function currentCard() {
    var a = document.activeElement;
    return a && a.closest ? a.closest("#tickets .ticket-card") : null;
  }
  function nextCard(card, step) {
    var all = cards();
    var i = all.indexOf(card);
    return all[i + step] || null;
  }
  function confirmBox(card, text, button) {
    var old = card.querySelector(".key-confirm");
    if (old) old.remove();
    var box = document.createElement("div");
    box.className = "key-confirm confirm";
    box.setAttribute("role", "alertdialog");
    var p = document.createElement("p");
    p.textContent = text;
    box.appendChild(p);
    var go = document.createElement("button");
    go.type = "button";
    go.className = button.className;
    go.textContent = "Confirm: " + button.textContent.trim().toLowerCase();
    go.addEventListener("click", function () { box.remove(); button.click(); });
    var no = document.createElement("button");
    no.type = "button";
    no.textContent = "Cancel (Esc)";
    no.addEventListener("click", function () { box.remove(); card.focus(); });
    box.appendChild(go);
    box.appendChild(no);
    card.querySelector(".ticket-head").after(box);
    go.focus();
  }
  function inboxKeys(e) {
    if (!document.getElementById("tickets") || e.ctrlKey || e.metaKey || e.altKey) return;
    var t = e.target;
    if (e.key === "Escape") {
      var box = t.closest && t.closest(".key-confirm");
      if (box) { var c = box.closest(".ticket-card"); box.remove(); c.focus(); }
      return;
    }
    if (t.matches && t.matches("input, textarea, select")) return;
    var card = currentCard();
    if (e.key === "j" || e.key === "k") {
      var all = cards();
      var to = card ? nextCard(card, e.key === "j" ? 1 : -1) : all[0];
      if (to) { to.focus(); to.scrollIntoView({ block: "nearest" }); }
      e.preventDefault();
    } else if (card && e.key === "a") {
      var approve = card.querySelector("button[value=approve]");
      if (approve) {
        e.preventDefault();
        confirmBox(card, "Approve #" + card.querySelector(".ticket-head h2 b").textContent.replace(/^#/, "") +
                   "? Enter confirms, Esc cancels.", approve);
      }
    } else if (card && e.key === "d") {
      var reason = card.querySelector("form.deny input[name=reason]");
      if (reason) {
        e.preventDefault();
        reason.focus();
        reason.placeholder = "reason, then Enter to deny (Esc: back)";
      }
    } else if (card && e.key === "x") {
      var box2 = card.querySelector("input.select");
      if (box2) { box2.checked = !box2.checked; updateSelected(); e.preventDefault(); }
    }
  }
  document.addEventListener("keydown", inboxKeys);

  // -- a WebSocket that reconnects, and polls while it is down -----------------------------
  function socket(path, handlers) {
    var delay = 1000, poll = null, closed = false, timer = null;
    var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + path;
    function startPoll() {
      if (poll === null && handlers.onPoll) poll = setInterval(handlers.onPoll, POLL_MS);
    }
    function stopPoll() { if (poll !== null) { clearInterval(poll); poll = null; } }
    var ws;
    function open() {
      timer = null;
      try { ws = new WebSocket(url); } catch (err) { startPoll(); return; }
      var opened = false;
      ws.onopen = function () {
        opened = true; delay = 1000; stopPoll();
        if (handlers.onOpen) handlers.onOpen();
      };
      ws.onmessage = function (e) {
        var data;
        try { data = JSON.parse(e.data); } catch (err) { return; }
        handlers.onMessage(data);
      };
      ws.onclose = function (e) {
        if (closed) return;
        if (e.code === 4404) { status("down", "This run does not exist."); return; }
        if (handlers.onDown) handlers.onDown();
        startPoll();
        // A reconnect that never opened says the server is gone: wait for the probe, which
        // reconnects the moment it answers, instead of backing off past its return.
        if (!opened && delay > 1000) { suspend(); return; }
        timer = setTimeout(open, delay);
        delay = Math.min(delay * 2, 4000);
      };
    }
    document.addEventListener("rt:reachable", function () {
      if (closed || (ws && ws.readyState <= 1)) return;
      if (timer !== null) clearTimeout(timer);
      delay = 1000;
      open();
    });
    open();
    return { close: function () { closed = true; stopPoll(); if (ws) ws.close(); } };
  }
  function status(kind, text, scope) {
    (scope || document).querySelectorAll("[data-live-status]").forEach(function (el) {
      el.textContent = text;
      el.dataset.conn = kind;
    });
  }

  // -- lists and tab counts refresh when any run commits -----------------------------------
  function startLists() {
    var fire = function () { htmx.trigger(document.body, "rt:commit"); };
    var list = document.querySelector("#listing, #tickets, #calls");
    socket(document.body.dataset.wsRunsUrl, {
      onOpen: function () { if (list) status("live", "Live: connected."); },
      onDown: function () {
        if (list) status("down", "Disconnected: reconnecting; the list is polled meanwhile.");
      },
      onMessage: function (m) { if (m.event === "commit") fire(); },
      onPoll: function () { htmx.trigger(document.body, "rt:poll"); },
    });
  }

  // -- the run page: committed panels plus the live, unconfirmed stream --------------------
  function startRun(panel) {
    // The stream of one claim of one attempt of one step; any change starts it afresh.
    // live.text is what is drawn (it may hold gap marks); live.next is the offset, in the
    // attempt's text, just past the last text received: offsets come from the messages only,
    // never from the drawn text (issue 29: counting the marks as text sliced later deltas).
    var live = { step: 0, attempt: 0, claim: null, text: "", next: null, gaps: 0, mid: false,
                 tools: [], seq: 0, last: 0 };
    var textEl = document.getElementById("live-text");
    var toolsEl = document.getElementById("live-tools");
    var stepEl = document.getElementById("live-step");
    var conn = null, watchdog = null;
    function committed() { return document.getElementById("committed"); }
    function ended() { var c = committed(); return c && c.dataset.state === "ended"; }
    function clear(note) {
      live.text = "";
      live.next = null;  // no text of this stream received yet
      live.gaps = 0;
      live.mid = false;
      live.tools = [];
      stepEl.textContent = note || "";
      render();
    }
    function atBottom(el) { return el.scrollHeight - el.scrollTop - el.clientHeight < 8; }
    function render() {
      var follow = atBottom(textEl);
      textEl.textContent = live.text;
      textEl.hidden = !live.text;
      textEl.dataset.gaps = String(live.gaps);
      textEl.dataset.midAnswer = live.mid ? "true" : "false";
      // Follow the tail unless the operator scrolled up to read.
      if (follow) textEl.scrollTop = textEl.scrollHeight;
      toolsEl.textContent = "";
      live.tools.forEach(function (t, i) {
        if (!t) return;
        var li = document.createElement("li");
        var head = document.createElement("b");
        head.textContent = "#" + i + " " + (t.name || "(name not received)");
        li.appendChild(head);
        if (!t.whole) {
          var note = document.createElement("span");
          note.className = "muted small";
          note.textContent = " joined mid-call: the arguments' start was not received";
          li.appendChild(note);
        }
        var pre = document.createElement("pre");
        pre.className = "untrusted";
        pre.textContent = t.args;
        li.appendChild(pre);
        toolsEl.appendChild(li);
      });
      panel.classList.toggle("streaming", !!(live.text || live.tools.length));
    }
    function interrupted() {
      watchdog = null;
      if (!(live.text || live.tools.length)) return;
      panel.classList.add("interrupted");
      stepEl.textContent = "Stream interrupted: no output for " + INTERRUPTED_MS / 1000 +
        " s (step " + live.step + ", attempt " + live.attempt + "). This text may never be committed.";
    }
    function arm() {
      panel.classList.remove("interrupted");
      if (watchdog) clearTimeout(watchdog);
      watchdog = setTimeout(interrupted, INTERRUPTED_MS);
    }
    function onDelta(d) {
      if (ended()) return;
      if (d.step < live.step || (d.step === live.step && d.attempt < live.attempt)) return;
      var claim = d.claim === undefined ? null : d.claim;
      var same = d.step === live.step && d.attempt === live.attempt;
      if (!same || (live.claim !== null && claim !== live.claim)) {
        var note = "";
        if (d.step === live.step && d.attempt > live.attempt) {
          note = "Attempt " + live.attempt + " failed; its text was dropped. ";
        } else if (d.step === live.step && live.step) {
          note = "Another worker took over; the previous text was dropped. ";
        }
        live.step = d.step;
        live.attempt = d.attempt;
        clear(note + "Step " + d.step + ", attempt " + d.attempt + " (unconfirmed)");
      }
      live.claim = claim;
      if (d.kind === "text") {
        var piece = d.text || "";
        // A text delta says where it goes (offset): what this page already has is skipped,
        // never shown twice; text that never arrived is marked where it is missing, and
        // only there (issue 22, 4; issue 29).
        if (typeof d.offset === "number") {
          if (live.next === null) {
            live.next = d.offset;
            if (d.offset > 0) {  // no checkpoint and the opening deltas were sent before we came
              live.mid = true;
              live.text = MID_MARK;
              stepEl.textContent += " Started mid-answer: the first " + d.offset +
                " characters were not received.";
            }
          }
          var end = d.offset + piece.length;
          if (end <= live.next) { arm(); return; }
          if (d.offset < live.next) piece = piece.slice(live.next - d.offset);
          else if (d.offset > live.next) { piece = GAP_MARK + piece; live.gaps += 1; }
          live.next = end;
        } else if (live.next !== null) {
          live.next += piece.length;  // a message without an offset (an older worker)
        }
        live.text += piece;
      } else if (d.kind === "tool_call") {
        var t = live.tools[d.index];
        if (!t) t = live.tools[d.index] = { name: "", args: "", whole: !!d.name };
        if (d.name) t.name = d.name;
        t.args += d.text || "";
      }
      arm();
      render();
    }
    function onEnded() {
      if (watchdog) { clearTimeout(watchdog); watchdog = null; }
      clear("");
      status("ended", "The run has ended: nothing more will stream.", panel);
      if (conn) { conn.close(); conn = null; }
    }
    function onCommit(m) {
      // A notice for a commit already shown (the log watcher repeats the real one) changes
      // nothing: the stream of the current step goes on.
      if (typeof m.seq !== "number" || m.seq <= live.seq) return;
      live.seq = m.seq;
      htmx.trigger(document.body, "rt:commit");
      clear("Commit #" + m.seq + " landed; committed state refreshed.");
      refresh(committed());
    }
    function hello(m) {
      // Committed state first: a page that missed commits while away refreshes now, and
      // the text streamed before those commits is stale.
      var c = committed();
      if (m.version > live.seq) { live.seq = m.version; clear(""); }
      if (c && String(m.version) !== c.dataset.version) refresh(c);
      // The stream so far (the worker's checkpoint), so a late viewer sees the opening words.
      if (m.stream && m.stream.text !== undefined && m.version === live.seq) {
        var cp = m.stream;
        var cpClaim = cp.claim === undefined ? null : cp.claim;
        // A page that reconnects and already has more of this very stream keeps it: the
        // checkpoint lags the deltas, and dropping what was drawn would hide received text.
        if (cp.step === live.step && cp.attempt === live.attempt && cpClaim === live.claim &&
            live.next !== null && live.next >= cp.text.length) {
          arm();
          return;
        }
        live.step = cp.step; live.attempt = cp.attempt; live.claim = cpClaim;
        clear("Step " + live.step + ", attempt " + live.attempt + " (unconfirmed; the start is " +
              "from the worker's last checkpoint)");
        live.text = cp.text;
        live.next = cp.text.length;  // the checkpoint is the attempt's text from its start
        arm();
        render();
      }
    }
    document.addEventListener("htmx:afterSettle", function (e) {
      var c = committed();
      if (c && e.detail.elt === c) {
        var version = Number(c.dataset.version);
        if (version > live.seq) {  // a poll found a commit the socket never announced
          live.seq = version;
          clear("Commit #" + version + " landed; committed state refreshed.");
        }
        if (ended()) onEnded();
      }
    });
    live.seq = Number(committed() ? committed().dataset.version : 0);
    if (ended()) { onEnded(); return; }
    conn = socket(panel.dataset.wsPath, {
      onOpen: function () { status("live", "Live: connected.", panel); },
      onDown: function () {
        status("down", "Disconnected: reconnecting; committed state is polled meanwhile.", panel);
      },
      onMessage: function (m) {
        if (m.event === "hello") hello(m);
        else if (m.event === "delta") onDelta(m);
        else if (m.event === "commit") onCommit(m);
      },
      onPoll: function () { refresh(committed()); },
    });
    render();
  }

  document.addEventListener("DOMContentLoaded", function () {
    unfold();
    tickTimes();
    setInterval(tickTimes, 10000);
    document.querySelectorAll("input.token").forEach(function (el) {
      el.addEventListener("focus", function () { el.select(); });
    });
    // Only a page served to someone who may read runs goes live (see base.html).
    var live = document.body.hasAttribute("data-live");
    if (live) {
      var panel = document.getElementById("live");
      if (panel) startRun(panel);
      else startLists();
    }
    // Set once the script has decided: a page without it never opens a socket afterwards.
    document.body.setAttribute("data-script", live ? "live" : "static");
  });
})();

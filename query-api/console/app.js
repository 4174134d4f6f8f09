// The ledger's operator console: plain JavaScript, no framework, no build step; served from the
// binary (query-api/src/console.rs) under a CSP that allows this origin only.
// Rules kept throughout: the admin token lives in sessionStorage (this tab) and travels only as
// a bearer header; amounts are shown exactly as the API's strings (never parsed into numbers);
// times are shown in UTC with their age; every text from the API goes in through textContent.
(function () {
  "use strict";

  var TOKEN_KEY = "ledger.console.token";
  var STATES = ["INIT", "SOURCE_PENDING", "SOURCE_DONE", "TARGET_PENDING", "COMPENSATING",
    "COMMITTED", "FAILED", "ROLLED_BACK"];
  var TERMINAL = { COMMITTED: true, FAILED: true, ROLLED_BACK: true };
  var POLL_MS = 2000;
  var token = null;
  var cleanups = [];

  // ---------- DOM ----------

  function h(tag, attrs) {
    var el = document.createElement(tag);
    var props = attrs || {};
    Object.keys(props).forEach(function (k) {
      var v = props[k];
      if (v === null || v === undefined || v === false) { return; }
      if (k === "class") { el.className = v; }
      else if (k.indexOf("on") === 0) { el.addEventListener(k.slice(2), v); }
      else if (k === "text") { el.textContent = v; }
      else { el.setAttribute(k, v === true ? "" : String(v)); }
    });
    for (var i = 2; i < arguments.length; i++) { append(el, arguments[i]); }
    return el;
  }

  function append(el, child) {
    if (child === null || child === undefined || child === false) { return; }
    if (Array.isArray(child)) { child.forEach(function (c) { append(el, c); }); return; }
    el.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }

  function replace(el, content) {
    while (el.firstChild) { el.removeChild(el.firstChild); }
    append(el, content);
  }

  function $(id) { return document.getElementById(id); }

  // ---------- time ----------

  function pad(n) { return n < 10 ? "0" + n : String(n); }

  function utc(iso) {
    if (!iso) { return "—"; }
    var d = new Date(iso);
    if (isNaN(d.getTime())) { return String(iso); }
    return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " +
      pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds()) + " UTC";
  }

  function duration(ms) {
    if (ms === null || ms === undefined) { return "—"; }
    var s = Math.floor(ms / 1000);
    if (s < 1) { return ms + " ms"; }
    if (s < 60) { return s + " s"; }
    if (s < 3600) { return Math.floor(s / 60) + " min " + (s % 60) + " s"; }
    if (s < 86400) { return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min"; }
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  }

  function ago(iso) {
    var t = new Date(iso).getTime();
    if (!iso || isNaN(t)) { return ""; }
    var ms = Date.now() - t;
    return ms < 0 ? "just now" : duration(ms) + " ago";
  }

  function when(iso) {
    if (!iso) { return h("span", { class: "muted" }, "—"); }
    return h("span", { class: "when", title: iso }, utc(iso), " ",
      h("span", { class: "muted small" }, "(" + ago(iso) + ")"));
  }

  // ---------- the API ----------

  function ApiError(status, code, message) {
    this.status = status;
    this.code = code;
    this.message = message;
  }
  ApiError.prototype.toString = function () {
    return this.code + " (HTTP " + this.status + "): " + this.message;
  };

  function authHeaders(extra) {
    var headers = { Authorization: "Bearer " + token };
    Object.keys(extra || {}).forEach(function (k) { headers[k] = extra[k]; });
    return headers;
  }

  function request(path, options, bearer) {
    var opts = options || {};
    var headers = { Authorization: "Bearer " + bearer };
    if (opts.body !== undefined) { headers["Content-Type"] = "application/json"; }
    return fetch(path, {
      method: opts.method || "GET",
      headers: headers,
      body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
      cache: "no-store",
      credentials: "omit",
      signal: opts.signal,
    }).then(function (res) {
      return res.text().then(function (text) {
        var body = null;
        try { body = text ? JSON.parse(text) : null; } catch (e) { body = null; }
        if (!res.ok) {
          var code = body && body.code ? body.code : "HTTP_" + res.status;
          var message = body && body.message ? body.message : (text || res.statusText);
          throw new ApiError(res.status, code, message);
        }
        return body;
      });
    });
  }

  function api(path, options) {
    return request(path, options, token).catch(function (e) {
      if (e instanceof ApiError && e.status === 401) {
        signOut("Your token was refused: " + e.toString() + ". It may have expired; sign in again.");
      }
      throw e;
    });
  }

  function errorBox(e) {
    return h("div", { class: "error", role: "alert" }, e instanceof ApiError ? e.toString() : String(e));
  }

  // ---------- sign-in ----------

  function claims(jwt) {
    try {
      var part = jwt.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
      return JSON.parse(atob(part + "===".slice((part.length + 3) % 4)));
    } catch (e) { return {}; }
  }

  function showSignedIn() {
    var c = claims(token);
    var left = c.exp ? duration(c.exp * 1000 - Date.now()) : "?";
    $("who-text").textContent = "admin user " + c.sub + " · token expires in " + left;
    $("signin").hidden = true;
    $("nav").hidden = false;
    $("who").hidden = false;
    $("app").hidden = false;
  }

  function signOut(message) {
    token = null;
    try { sessionStorage.removeItem(TOKEN_KEY); } catch (e) { /* storage off: nothing kept */ }
    stopPage();
    $("nav").hidden = true;
    $("who").hidden = true;
    $("app").hidden = true;
    $("signin").hidden = false;
    $("halt-banner").hidden = true;
    var box = $("signin-error");
    box.hidden = !message;
    box.textContent = message || "";
  }

  function refusalText(e) {
    if (!(e instanceof ApiError)) { return "Could not reach the ledger: " + String(e); }
    var why = e.status === 403
      ? "This token is valid but is not an admin token (no role \"admin\"); the console needs one."
      : e.status === 401
        ? "The ledger does not accept this token (bad signature, expired or malformed)."
        : "The ledger refused the sign-in.";
    return "Refused: " + e.toString() + ". " + why;
  }

  function onSignIn(ev) {
    ev.preventDefault();
    var candidate = $("token").value.trim().replace(/^Bearer\s+/i, "");
    var box = $("signin-error");
    box.hidden = true;
    if (!candidate) { return; }
    $("signin-button").disabled = true;
    request("/api/v1/admin/assets", {}, candidate).then(function () {
      token = candidate;
      try { sessionStorage.setItem(TOKEN_KEY, token); } catch (e) { /* kept in memory only */ }
      $("token").value = "";
      showSignedIn();
      route();
    }, function (e) {
      box.textContent = refusalText(e);
      box.hidden = false;
    }).then(function () { $("signin-button").disabled = false; });
  }

  // ---------- page life ----------

  function stopPage() {
    cleanups.forEach(function (f) { try { f(); } catch (e) { /* already stopped */ } });
    cleanups = [];
  }

  function every(ms, fn) {
    var stopped = false;
    var timer = null;
    function tick() {
      if (stopped) { return; }
      Promise.resolve().then(fn).catch(function () { /* shown by fn */ }).then(function () {
        if (!stopped) { timer = setTimeout(tick, ms); }
      });
    }
    tick();
    cleanups.push(function () { stopped = true; clearTimeout(timer); });
  }

  function parseHash() {
    var raw = location.hash.replace(/^#\/?/, "");
    var q = raw.indexOf("?");
    var path = q < 0 ? raw : raw.slice(0, q);
    var params = new URLSearchParams(q < 0 ? "" : raw.slice(q + 1));
    var parts = path.split("/").map(decodeURIComponent);
    return { page: parts[0] || "overview", arg: parts[1] || "", params: params };
  }

  var PAGES = {};

  function route() {
    if (!token) { return; }
    stopPage();
    var r = parseHash();
    var nav = document.querySelectorAll("#nav a[data-page]");
    Array.prototype.forEach.call(nav, function (a) {
      var page = a.getAttribute("data-page");
      var active = page === r.page || (page === "transfers" && r.page === "transfer") || (page === "invariant" && r.page === "check");
      a.className = active ? "active" : "";
    });
    var render = PAGES[r.page] || PAGES.overview;
    var root = $("app");
    replace(root, []);
    render(root, r);
    window.scrollTo(0, 0);
  }

  // ---------- shared pieces ----------

  function stateBadge(state) { return h("span", { class: "state " + state }, state || "?"); }

  function reqLink(reqId) { return h("a", { class: "id", href: "#/transfer/" + encodeURIComponent(reqId) }, reqId); }

  function userLink(userId) { return h("a", { class: "nowrap", href: "#/user/" + encodeURIComponent(userId) }, "user " + userId); }

  function amount(text) { return h("span", { class: "amount" }, text === null || text === undefined ? "—" : String(text)); }

  function card(title, body, extra) {
    return h("section", { class: "card" }, h("h2", {}, title, extra || null), body);
  }

  function transferTable(rows, opts) {
    var o = opts || {};
    if (!rows || rows.length === 0) { return h("div", { class: "empty" }, o.empty || "No transfers."); }
    return h("table", { class: "transfers" },
      h("thead", {}, h("tr", {},
        h("th", {}, "req_id"), h("th", {}, "user"), h("th", {}, "cid"), h("th", {}, "from → to"),
        h("th", {}, "asset"), h("th", { class: "num" }, "amount"), h("th", {}, "state"),
        h("th", {}, "created"), h("th", {}, "last change"))),
      h("tbody", {}, rows.map(function (t) {
        return h("tr", { "data-req-id": t.req_id },
          h("td", {}, reqLink(t.req_id)), h("td", {}, userLink(t.user_id)),
          h("td", { class: "mono small" }, t.cid || ""), h("td", {}, t.from + " → " + t.to),
          h("td", {}, t.asset), h("td", { class: "num" }, amount(t.amount)),
          h("td", {}, stateBadge(t.state)), h("td", {}, when(t.created_at)),
          h("td", {}, t.age_ms !== undefined ? duration(t.age_ms) + " ago" : when(t.updated_at)));
      })));
  }

  function live(label) {
    var dot = h("span", { class: "live-dot" });
    var text = h("span", { class: "muted small" }, label);
    return { el: h("span", { class: "live" }, dot, text), ok: function (msg) { dot.className = "live-dot on"; text.textContent = msg; },
      bad: function (msg) { dot.className = "live-dot"; text.textContent = msg; } };
  }

  function settled(promise) {
    return promise.then(function (v) { return { ok: true, value: v }; }, function (e) { return { ok: false, error: e }; });
  }

  function showHalt(halted, reason) {
    var b = $("halt-banner");
    b.hidden = !halted;
    b.textContent = halted ? "Transfers are HALTED: the conservation check found a violation" +
      (reason ? " (" + reason + ")" : "") + ". New transfers are refused until an admin clears the halt on the Conservation page." : "";
  }

  // ---------- overview ----------

  PAGES.overview = function (root) {
    var indicator = live("connecting…");
    var stateBox = h("div");
    var statsBox = h("div", { class: "grid" });
    var alertsBox = h("div");
    var stuckBox = h("div");
    var recentBox = h("div");
    var haBox = h("div", { id: "cells-ha" });
    var movesBox = h("div", { id: "cells-moves" });
    var moveForm = moveControls(function () { refresh(); });
    var thresholdSel = h("select", { id: "stuck-threshold", onchange: function () { refresh(); } },
      [["5000", "5 s"], ["30000", "30 s"], ["60000", "1 min"], ["300000", "5 min"], ["3600000", "1 h"]].map(function (o) {
        return h("option", { value: o[0], selected: o[0] === (parseHash().params.get("stuck_ms") || "60000") }, o[1]);
      }));
    append(root, [
      h("h1", {}, "Overview ", indicator.el),
      statsBox,
      card("Cells: members, roles and failovers", haBox),
      card("Partition moves", movesBox, moveForm.el),
      card("Transfers by state", stateBox),
      card("Alerts (MON-004: abnormal request frequency)", alertsBox),
      card("Stuck transfers", stuckBox, h("span", { class: "muted small" }, "  open and unchanged for at least ", thresholdSel)),
      card("Recent transfers", recentBox),
    ]);
    function refresh() {
      var stuckMs = thresholdSel.value;
      return Promise.all([
        settled(api("/api/v1/admin/overview")),
        settled(api("/api/v1/admin/transfers?limit=15")),
        settled(api("/api/v1/admin/transfers/stuck?older_than_ms=" + encodeURIComponent(stuckMs) + "&limit=50")),
        settled(api("/api/v1/admin/alerts?limit=10")),
        settled(api("/api/v1/admin/cells")),
        settled(api("/api/v1/admin/cells/moves")),
      ]).then(function (r) {
        replace(haBox, cellsHaView(r[4]));
        moveForm.cells(r[4]);
        moveForm.el.hidden = !r[5].ok && r[5].error.status === 404;
        replace(movesBox, movesView(r[5], function () { refresh(); }));
        renderOverview(r[0], stateBox, statsBox);
        replace(recentBox, r[1].ok ? transferTable(r[1].value.transfers) : errorBox(r[1].error));
        replace(stuckBox, r[2].ok ? stuckTable(r[2].value.transfers) : errorBox(r[2].error));
        replace(alertsBox, alertsView(r[3]));
        var failed = r.filter(function (x) { return !x.ok && x.error.status !== 404; }).length;
        if (failed) { indicator.bad("live · " + failed + " request(s) failed at " + utc(new Date().toISOString())); }
        else { indicator.ok("live · refreshed every 2 s · last " + utc(new Date().toISOString())); }
      });
    }
    every(POLL_MS, refresh);
  };

  // ---------- partition moves (ADR 0023) ----------

  // The form that starts a move: a partition and a target cell; answered in place.
  function moveControls(done) {
    var partition = h("input", { id: "move-partition", type: "number", min: "0", max: "255", placeholder: "partition", class: "narrow" });
    var to = h("select", { id: "move-to" });
    var out = h("span", { id: "move-out", class: "small" });
    var go = h("button", { id: "move-start", type: "button", onclick: function () {
      if (partition.value === "" || !to.value) { replace(out, h("span", { class: "pill warn" }, "choose a partition and a cell")); return; }
      go.disabled = true;
      api("/api/v1/admin/cells/moves", { method: "POST", body: { partition: Number(partition.value), to: Number(to.value) } })
        .then(function (m) { replace(out, h("span", { class: "pill good" }, "move " + m.id + " started: partition " + m.partition + ", cell " + m.from + " → " + m.to)); done(); },
          function (e) { replace(out, errorBox(e)); })
        .then(function () { go.disabled = false; });
    } }, "Move");
    // A cell added to the running deployment (`POST /api/v1/admin/cells`): it owns nothing
    // until a move gives it a partition, so it joins the "to cell" choice at once.
    var add = h("button", { id: "cell-add", type: "button", onclick: function () {
      if (!window.confirm("Add a new cell to the running deployment? It owns no partition until you move some to it.")) { return; }
      add.disabled = true;
      api("/api/v1/admin/cells", { method: "POST", body: {} })
        .then(function (c) { replace(out, h("span", { class: "pill good" }, "cell " + c.cell + " added (map version " + c.map_version + "): move partitions to it")); done(); },
          function (e) { replace(out, errorBox(e)); })
        .then(function () { add.disabled = false; });
    } }, "Add a cell");
    var el = h("span", { class: "muted small" }, "  move partition ", partition, " to cell ", to, " ", go, " ", add, " ", out);
    var known = "";
    return {
      el: el,
      cells: function (result) {
        if (!result.ok || !result.value.cells) { return; }
        var ids = result.value.cells.map(function (c) { return String(c.cell); });
        if (ids.join(",") === known) { return; }
        known = ids.join(",");
        replace(to, ids.map(function (id) { return h("option", { value: id }, "cell " + id); }));
      },
    };
  }

  var STEP_PILL = { DONE: "good", CANCELLED: "warn", CANCELLING: "warn", PAUSING: "warn", MOVING_SPOT: "warn", VERIFYING: "warn", SWITCHING: "warn" };

  function movesView(result, done) {
    if (!result.ok && result.error.status === 404) {
      return h("div", { class: "muted" }, "Moves run under a cell map (ledger up --cells N).");
    }
    if (!result.ok) { return errorBox(result.error); }
    var moves = result.value.moves || [];
    if (!moves.length) { return h("div", { class: "empty" }, "No partition has moved yet."); }
    return h("table", { id: "moves-table" },
      h("thead", {}, h("tr", {}, ["move", "partition", "from → to", "step", "copied", "reason", ""].map(function (t) { return h("th", {}, t); }))),
      h("tbody", {}, moves.slice(0, 10).map(function (m) {
        var ended = m.step === "DONE" || m.step === "CANCELLED";
        var cancel = ended || m.step === "SWITCHING" ? null : h("button", { type: "button", class: "small", onclick: function () {
          api("/api/v1/admin/cells/moves/" + encodeURIComponent(m.id) + "/cancel", { method: "POST" }).then(done, function (e) { alert(e.toString()); });
        } }, "Cancel");
        return h("tr", {},
          h("td", { class: "mono small" }, m.id),
          h("td", { class: "num" }, String(m.partition)),
          h("td", {}, "cell " + m.from + " → " + m.to),
          h("td", {}, h("span", { class: "pill " + (STEP_PILL[m.step] || "") }, m.step)),
          h("td", { class: "num" }, String(m.copied)),
          h("td", { class: "small" }, m.reason || ""),
          h("td", {}, cancel));
      })));
  }

  function stat(title, value, note) {
    return h("section", { class: "card" }, h("h2", {}, title), h("div", { class: "big" }, value),
      note ? h("div", { class: "muted small" }, note) : null);
  }

  function renderOverview(result, stateBox, statsBox) {
    if (!result.ok) {
      replace(stateBox, errorBox(result.error));
      replace(statsBox, []);
      return;
    }
    var o = result.value;
    showHalt(o.halted, o.halt_reason);
    var counts = o.by_state || {};
    replace(stateBox, h("div", { class: "state-tiles" }, STATES.map(function (s) {
      return h("div", { class: "state-tile" + (counts[s] ? "" : " zero") }, stateBadge(s), h("span", { class: "count mono" }, String(counts[s] || 0)));
    })));
    var check = o.last_check;
    var lag = o.lag || {};
    replace(statsBox, [
      cellsStat(o),
      stat("Created in the last minute", String(o.rate_last_minute === undefined ? "—" : o.rate_last_minute)),
      stat("Oldest open transfer", o.oldest_open_age_ms === null || o.oldest_open_age_ms === undefined ? "none" : duration(o.oldest_open_age_ms),
        o.oldest_open_req_id ? reqLink(o.oldest_open_req_id) : "no transfer is open"),
      stat("Last conservation check", check ? h("span", { class: "pill " + (check.ok ? "good" : "bad") }, check.ok ? "conserved" : check.violations + " violation(s)") : "never",
        check ? [check.mode + " · " + check.duration_ms + " ms · ", when(check.at)] : null),
      stat("Transfers", o.halted ? h("span", { class: "pill bad" }, "HALTED") : h("span", { class: "pill good" }, "accepted"),
        o.halted ? o.halt_reason : "no halt"),
      stat("Lag", h("span", { class: "small" },
        "projector " + (lag.projector_positions === undefined ? "—" : lag.projector_positions) + " events / " + (lag.projector_seconds === undefined ? "—" : lag.projector_seconds) + " s"),
        "recovery pass " + (lag.recovery_last_pass_age_ms === null || lag.recovery_last_pass_age_ms === undefined ? "—" : duration(lag.recovery_last_pass_age_ms) + " ago") +
        " · relay " + (lag.relay_positions === null || lag.relay_positions === undefined ? "off" : lag.relay_positions + " events / " + lag.relay_seconds + " s")),
    ]);
  }

  // Under a cell map (ADR 0017) the overview adds up every cell and names each one's state; the
  // figures above are the cells that answered, and a cell that is down is named here.
  function cellsStat(o) {
    if (!o.cells) { return null; }
    var down = o.cells.filter(function (c) { return c.state !== "up"; }).map(function (c) { return c.cell; });
    var value = down.length
      ? h("span", { class: "pill bad", id: "cells-down" }, "cell " + down.join(", ") + " down")
      : h("span", { class: "pill good" }, "all " + o.cells.length + " up");
    var note = o.cells.map(function (c) {
      return "cell " + c.cell + ": " + (c.state === "up" ? (c.halted ? "halted" : "up") : "down since " + utc(c.down_since));
    }).join(" · ");
    return stat("Cells", value, note + (down.length ? " · figures show the other cells" : ""));
  }

  // Each cell's members under HA (ADR 0020) with their role now, the replication lag, the spot-core
  // replicas acknowledging, what this ledger has no leader of, and the last failover recorded.
  function cellsHaView(result) {
    if (!result.ok && result.error.status === 404) {
      return h("div", { class: "muted" }, "This ledger build has no cells route (GET /api/v1/admin/cells).");
    }
    if (!result.ok) { return errorBox(result.error); }
    var v = result.value;
    var out = (v.cells || []).map(cellHa);
    if (v.down_cells && v.down_cells.length) {
      out.push(h("div", { class: "pill bad" }, "cell " + v.down_cells.join(", ") + " did not answer"));
    }
    return out.length ? out : h("div", { class: "empty" }, "No cell answered.");
  }

  var ROLE_PILL = { leader: "good", standby: "", follower: "", down: "bad", unknown: "warn" };
  var KIND_NAME = { postgres: "PostgreSQL", "spot-core": "spot-core" };

  function bytes(n) {
    if (n === null || n === undefined) { return "—"; }
    if (n < 1024) { return n + " B"; }
    if (n < 1048576) { return (n / 1024).toFixed(1) + " KiB"; }
    return (n / 1048576).toFixed(1) + " MiB";
  }

  function memberLag(m, c) {
    if (m.role === "leader" && m.kind === "spot-core") { return m.epoch ? "leads epoch " + m.epoch : "single engine"; }
    if (m.role === "leader") {
      var sync = (c.members || []).filter(function (o) { return o.kind === "postgres" && o.sync; }).length;
      return c.ha ? "primary · " + (sync ? sync + " synchronous standby" : "NO synchronous standby") : "primary";
    }
    if (m.role === "down") { return "—"; }
    if (m.kind === "postgres") {
      if (m.lag_bytes === null || m.lag_bytes === undefined) { return "—"; }
      return bytes(m.lag_bytes) + " / " + (m.lag_seconds || 0).toFixed(1) + " s behind" +
        (m.sync ? " · synchronous" : " · not synchronous");
    }
    if (m.lag_records === null || m.lag_records === undefined) { return "see the leader's view of its followers below"; }
    return m.lag_records + " records behind";
  }

  // Leaders first, then standbys and followers, then the rest, each kind together.
  function memberOrder(a, b) {
    var rank = { leader: 0, standby: 1, follower: 1, unknown: 2, down: 3 };
    if (a.kind !== b.kind) { return a.kind === "postgres" ? -1 : 1; }
    return (rank[a.role] === undefined ? 2 : rank[a.role]) - (rank[b.role] === undefined ? 2 : rank[b.role]);
  }

  function cellHa(c) {
    var summary = [];
    if (!c.ha) {
      summary.push(h("span", { class: "pill" }, "no HA"), " one database and one spot-core; nothing fails over on its own");
    } else {
      var pg = (c.members || []).filter(function (m) { return m.kind === "postgres"; });
      if (pg.length > 1) {
        var primary = pg.filter(function (m) { return m.role === "leader"; })[0];
        var syncs = pg.filter(function (m) { return m.sync; }).length;
        summary.push(h("span", { class: "pill " + (primary && syncs ? "good" : "bad") },
          "PostgreSQL: " + (primary ? "primary " + primary.name : "NO primary") + " · " +
          (syncs ? syncs + " synchronous standby" : "no synchronous standby")), " ");
      }
    }
    if (c.ha && !c.spot_replication && (c.members || []).filter(function (m) { return m.kind === "spot-core"; }).length > 1) {
      summary.push(h("span", { class: "pill bad" }, "spot-core: no leader answers"), " ");
    }
    if (c.ha && c.spot_replication) {
      var n = c.spot_replication.acknowledging;
      summary.push(h("span", { class: "pill " + (n >= 3 ? "good" : n === 2 ? "warn" : "bad") },
        "spot-core: " + n + " of 3 replicas acknowledging"),
        " ", n === 2 ? "(one lost: no spare) " : n < 2 ? "(nothing is acknowledged) " : "");
    }
    (c.leaderless || []).forEach(function (l) {
      summary.push(" ", h("span", { class: "pill bad" }, "no " + KIND_NAME[l.kind] + " leader for " + duration(l.seconds * 1000)));
    });
    var rows = (c.members || []).slice().sort(memberOrder).map(function (m) {
      return h("tr", { "data-member": m.name, "data-role": m.role },
        h("td", {}, KIND_NAME[m.kind] || m.kind),
        h("td", { class: "mono" }, m.name, m.address === m.name ? null : h("span", { class: "muted small" }, " " + m.address)),
        h("td", {}, h("span", { class: "pill " + (ROLE_PILL[m.role] === undefined ? "warn" : ROLE_PILL[m.role]) }, m.role)),
        h("td", {}, memberLag(m, c)),
        h("td", { class: "small muted" }, m.error || (m.state && m.state !== "running" ? m.state : "")));
    });
    var followers = c.spot_replication && c.spot_replication.followers.length
      ? h("div", { class: "muted small" }, "spot-core leader's view of its followers (epoch " + c.spot_replication.epoch + "): " +
        c.spot_replication.followers.map(function (f) {
          return f.name + " acknowledged seq " + f.acked_seq + ", " + f.lag + " records behind";
        }).join(" · "))
      : null;
    var f = c.last_failover;
    var last = f
      ? h("div", { class: "failover" }, h("strong", {}, "Last failover: "), KIND_NAME[f.kind] + " ",
        h("span", { class: "mono" }, (f.from_member || "none") + " → " + f.to_member),
        f.epoch ? " (epoch " + f.epoch + ")" : "", " at ", when(f.at),
        h("div", { class: "muted small" }, f.cause + " · observed by " + f.observed_by))
      : h("div", { class: "muted" }, "Last failover: none recorded.");
    return h("section", { class: "cell-ha", "data-cell": c.cell },
      h("h3", {}, "Cell " + c.cell + " "), h("div", { class: "small" }, summary),
      h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "kind"), h("th", {}, "member"),
        h("th", {}, "role now"), h("th", {}, "replication"), h("th", {}, "note"))), h("tbody", {}, rows)),
      followers, last);
  }

  function stuckTable(rows) {
    if (!rows || rows.length === 0) { return h("div", { class: "empty" }, "Nothing is stuck."); }
    return h("table", { id: "stuck-table" },
      h("thead", {}, h("tr", {}, h("th", {}, "req_id"), h("th", {}, "user"), h("th", {}, "from → to"), h("th", {}, "asset"),
        h("th", { class: "num" }, "amount"), h("th", {}, "state"), h("th", {}, "unchanged for"), h("th", {}, "attempts"), h("th", {}, "last error"),
        h("th", {}, "next retry"))),
      h("tbody", {}, rows.map(function (t) {
        return h("tr", { "data-req-id": t.req_id }, h("td", {}, reqLink(t.req_id)), h("td", {}, userLink(t.user_id)),
          h("td", {}, t.from + " → " + t.to), h("td", {}, t.asset), h("td", { class: "num" }, amount(t.amount)),
          h("td", {}, stateBadge(t.state)), h("td", {}, duration(t.age_ms)), h("td", { class: "num" }, String(t.attempts || 0)),
          h("td", {}, t.last_error_category ? h("span", { class: "pill warn" }, t.last_error_category) : "—"),
          h("td", {}, when(t.next_retry_at)));
      })));
  }

  function alertsView(result) {
    if (!result.ok && result.error.status === 404) {
      return h("div", { class: "muted" }, "This ledger build has no alerts route (GET /api/v1/admin/alerts).");
    }
    if (!result.ok) { return errorBox(result.error); }
    var alerts = result.value.alerts || [];
    if (alerts.length === 0) { return h("div", { class: "empty" }, "No alerts."); }
    return h("table", { id: "alerts-table" }, h("thead", {}, h("tr", {}, h("th", {}, "when"), h("th", {}, "code"), h("th", {}, "severity"),
      h("th", {}, "user"), h("th", {}, "detail"))),
      h("tbody", {}, alerts.map(function (a) {
        return h("tr", {}, h("td", {}, when(a.at)), h("td", { class: "mono" }, a.code),
          h("td", {}, h("span", { class: "pill " + (a.severity === "CRITICAL" ? "bad" : "warn") }, a.severity)),
          h("td", {}, a.user_id !== null && a.user_id !== undefined ? userLink(a.user_id) : "—"), h("td", {}, typeof a.detail === "string" ? a.detail : JSON.stringify(a.detail)));
      })));
  }

  // ---------- transfers ----------

  PAGES.transfers = function (root, r) {
    var p = r.params;
    var form = h("form", { class: "toolbar", id: "transfer-filters" },
      field("State", h("select", { name: "state" }, [h("option", { value: "" }, "any"), h("option", { value: "OPEN", selected: p.get("state") === "OPEN" }, "OPEN (not terminal)")]
        .concat(STATES.map(function (s) { return h("option", { value: s, selected: p.get("state") === s }, s); })))),
      field("User id", h("input", { name: "user_id", size: 8, value: p.get("user_id") || "", inputmode: "numeric" })),
      field("Asset", h("input", { name: "asset", size: 7, value: p.get("asset") || "" })),
      field("Unchanged for at least", h("select", { name: "older_than_ms" },
        [["", "any age"], ["5000", "5 s"], ["60000", "1 min"], ["600000", "10 min"], ["3600000", "1 h"], ["86400000", "1 day"]].map(function (o) {
          return h("option", { value: o[0], selected: (p.get("older_than_ms") || "") === o[0] }, o[1]);
        }))),
      h("button", { type: "submit" }, "Filter"));
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var q = new URLSearchParams();
      ["state", "user_id", "asset", "older_than_ms"].forEach(function (k) {
        var v = form.elements[k].value.trim();
        if (v) { q.set(k, k === "asset" ? v.toUpperCase() : v); }
      });
      location.hash = "#/transfers?" + q.toString();
    });
    var search = searchForm();
    var list = h("div", {}, h("div", { class: "muted" }, "Loading…"));
    append(root, [h("h1", {}, "Transfers"), card("Find one", search), card("Filter", [form, list])]);
    loadPage(list, p, null);
  };

  function field(label, input) { return h("div", { class: "field" }, h("label", {}, label), input); }

  function searchForm() {
    var input = h("input", { name: "q", id: "search-q", size: 34, placeholder: "req_id, or user id, or cid" });
    var kind = h("select", { name: "kind", id: "search-kind" }, h("option", { value: "req_id" }, "req_id"),
      h("option", { value: "user" }, "user id"), h("option", { value: "cid" }, "cid (with user id)"));
    var cidUser = h("input", { name: "cid_user", id: "search-cid-user", size: 8, placeholder: "user id" });
    var out = h("div");
    var form = h("form", { class: "toolbar", id: "search-form" }, field("Search by", kind), field("Value", input),
      field("User (for cid)", cidUser), h("button", { type: "submit" }, "Search"));
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var q = input.value.trim();
      replace(out, []);
      if (!q) { return; }
      if (kind.value === "req_id") { location.hash = "#/transfer/" + encodeURIComponent(q); }
      else if (kind.value === "user") { location.hash = "#/user/" + encodeURIComponent(q); }
      else {
        var u = cidUser.value.trim();
        if (!u) { replace(out, h("div", { class: "error" }, "A cid belongs to one user: give the user id too.")); return; }
        api("/api/v1/admin/transfers?user_id=" + encodeURIComponent(u) + "&cid=" + encodeURIComponent(q) + "&limit=5").then(function (b) {
          if (b.transfers.length === 1) { location.hash = "#/transfer/" + encodeURIComponent(b.transfers[0].req_id); }
          else { replace(out, transferTable(b.transfers, { empty: "No transfer of user " + u + " has cid " + q + "." })); }
        }, function (e) { replace(out, errorBox(e)); });
      }
    });
    return [form, out];
  }

  function loadPage(list, params, after) {
    var q = new URLSearchParams();
    ["state", "user_id", "asset", "older_than_ms"].forEach(function (k) { if (params.get(k)) { q.set(k, params.get(k)); } });
    q.set("limit", "50");
    if (after) { q.set("after", after); }
    api("/api/v1/admin/transfers?" + q.toString()).then(function (b) {
      var more = b.next ? h("button", { class: "secondary", type: "button", onclick: function () { loadPage(list, params, b.next); } }, "Next page →") : null;
      replace(list, [transferTable(b.transfers, { empty: "No transfer matches." }), h("p", {}, more,
        after ? h("button", { class: "secondary", type: "button", onclick: function () { loadPage(list, params, null); } }, "Back to newest") : null)]);
    }, function (e) { replace(list, errorBox(e)); });
  }

  // ---------- one transfer ----------

  PAGES.transfer = function (root, r) {
    var reqId = r.arg;
    var body = h("div", {}, h("div", { class: "muted" }, "Loading…"));
    append(root, [h("h1", {}, "Transfer ", h("span", { class: "id" }, reqId)), body]);
    function load() {
      return api("/api/v1/admin/transfers/" + encodeURIComponent(reqId)).then(function (t) {
        replace(body, transferView(t, load));
      }, function (e) {
        replace(body, e instanceof ApiError && e.status === 404
          ? h("div", { class: "error" }, "No transfer has req_id " + reqId + " (" + e.toString() + ").") : errorBox(e));
      });
    }
    load();
  };

  function resolutionOf(t) {
    if (t.resolution) { return t.resolution; }
    var ev = (t.events || []).filter(function (e) { return e.type === "TransferManuallyResolved"; })[0];
    if (!ev || !ev.data) { return null; }
    var d = ev.data.TransferManuallyResolved || ev.data;
    return { by: d.operator, at: d.at || ev.at, reason: d.reason, outcome: d.resolution };
  }

  function transferView(t, reload) {
    var row = t.transfer || {};
    var open = !TERMINAL[row.state];
    var resolution = resolutionOf(t);
    return [
      h("section", { class: "card" }, h("dl", { class: "kv" },
        h("dt", {}, "state"), h("dd", {}, stateBadge(row.state), open ? h("span", { class: "muted small" }, "  open: ", h("a", { href: "#resolve-form", onclick: function (ev) { ev.preventDefault(); $("resolve-form").scrollIntoView(); } }, "resolve it below")) : null),
        h("dt", {}, "user"), h("dd", {}, userLink(row.user_id)),
        h("dt", {}, "movement"), h("dd", {}, amount(row.amount), " ", row.asset, " from ", row.from, " to ", row.to),
        h("dt", {}, "cid"), h("dd", { class: "mono" }, row.cid || "—"),
        h("dt", {}, "created"), h("dd", {}, when(row.created_at)),
        h("dt", {}, "last change"), h("dd", {}, when(row.updated_at)),
        h("dt", {}, "trace id"), h("dd", { class: "mono", id: "trace-id" }, t.trace_id || "— (traces were not exported)")),
        h("p", {}, h("button", { type: "button", class: "secondary", onclick: reload }, "Refresh"))),
      resolution ? h("section", { class: "card" }, h("h2", {}, "Manual resolution"), h("div", { class: "resolution", id: "resolution" },
        h("div", {}, "Resolved as ", stateBadge(resolution.outcome), " by ", h("strong", { class: "mono" }, resolution.by), " at ", when(resolution.at)),
        h("div", {}, "Reason: ", h("q", { class: "reason" }, resolution.reason)))) : null,
      card("Timeline", timeline(t.events || [])),
      card("Account systems' records for this req_id", adapterRecords(t)),
      card("Recovery attempts", attemptsTable(t.attempts || [])),
      open ? resolveForm(row, reload) : null,
    ];
  }

  function timeline(events) {
    if (events.length === 0) { return h("div", { class: "empty" }, "No events."); }
    return h("ol", { class: "timeline", id: "timeline" }, events.map(function (e) {
      var cls = /ManuallyResolved|RolledBack|Compensation/.test(e.type) ? "resolved" : /Committed/.test(e.type) ? "terminal" : /Failed/.test(e.type) ? "failure" : "";
      return h("li", { class: cls }, h("div", {}, h("span", { class: "event-type" }, e.type), " ",
        h("span", { class: "muted small" }, "v" + e.version + " · "), when(e.at)), eventData(e.data));
    }));
  }

  function eventData(data) {
    if (!data || typeof data !== "object") { return null; }
    var inner = data;
    var keys = Object.keys(data);
    if (keys.length === 1 && data[keys[0]] && typeof data[keys[0]] === "object") { inner = data[keys[0]]; }
    var pairs = Object.keys(inner).filter(function (k) { return k !== "at"; }).map(function (k) {
      var v = inner[k];
      return h("span", { class: "small" }, h("span", { class: "muted" }, k + "="), h("span", { class: "mono" }, typeof v === "object" ? JSON.stringify(v) : String(v)), "  ");
    });
    return h("div", {}, pairs);
  }

  function attemptsTable(attempts) {
    if (attempts.length === 0) { return h("div", { class: "empty" }, "No recovery attempt recorded."); }
    return h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "when"), h("th", {}, "outcome"), h("th", {}, "error category"), h("th", {}, "detail"))),
      h("tbody", {}, attempts.map(function (a) {
        return h("tr", {}, h("td", {}, when(a.at)), h("td", {}, a.outcome || "—"),
          h("td", {}, a.error_category ? h("span", { class: "pill warn" }, a.error_category) : "—"), h("td", { class: "small" }, a.detail || ""));
      })));
  }

  function adapterRecords(t) {
    var funding = t.funding || [];
    var fundingView = funding.length === 0 ? h("div", { class: "empty" }, "No FUNDING journal row.")
      : h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "operation"), h("th", { class: "num" }, "amount"), h("th", {}, "result"), h("th", {}, "when"))),
        h("tbody", {}, funding.map(function (f) {
          return h("tr", {}, h("td", { class: "mono" }, f.operation), h("td", { class: "num" }, amount(f.amount)),
            h("td", {}, f.state || "—", f.code ? " (" + f.code + ")" : ""), h("td", {}, when(f.at)));
        })));
    var spot = t.spot;
    var spotView = !spot ? h("div", { class: "empty" }, "Not looked up.")
      : spot.error ? h("div", { class: "error" }, "spot-core could not answer the lookup: " + spot.error)
        : !spot.records || spot.records.length === 0 ? h("div", { class: "empty" }, "spot-core has no record of this req_id.")
          : h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "operation"), h("th", { class: "num" }, "amount"), h("th", {}, "outcome"), h("th", {}, "code"), h("th", { class: "num" }, "seq"))),
            h("tbody", {}, spot.records.map(function (r) {
              return h("tr", {}, h("td", { class: "mono" }, r.op), h("td", { class: "num" }, amount(r.amount)), h("td", {}, r.outcome),
                h("td", {}, r.code || "—"), h("td", { class: "num mono" }, String(r.seq)));
            })));
    return [h("h2", {}, "FUNDING (PostgreSQL journal)"), fundingView, h("h2", { class: "spaced" }, "SPOT (spot-core lookup)"), spotView];
  }

  function resolveForm(row, reload) {
    var out = h("div");
    var reason = h("textarea", { id: "resolve-reason", rows: 3, maxlength: 1000, placeholder: "What you checked and why (required; recorded in the event log with your user id)" });
    var applied = h("input", { type: "radio", name: "resolution", value: "APPLIED", id: "resolve-applied" });
    var notApplied = h("input", { type: "radio", name: "resolution", value: "NOT_APPLIED", id: "resolve-not-applied" });
    var force = h("input", { type: "checkbox", id: "resolve-force" });
    var submit = h("button", { type: "submit", id: "resolve-submit", disabled: true }, "Record resolution");
    function check() { submit.disabled = !(reason.value.trim() && (applied.checked || notApplied.checked)); }
    [reason, applied, notApplied].forEach(function (el) { el.addEventListener("input", check); el.addEventListener("change", check); });
    var form = h("form", { id: "resolve-form" },
      h("p", { class: "muted" }, "Only when you have confirmed with the account systems what happened. The ledger checks the account system's own record first and refuses a resolution it contradicts."),
      h("div", { class: "radio-row" },
        h("label", {}, applied, "APPLIED (the pending call took effect)"),
        h("label", {}, notApplied, "NOT_APPLIED (it did not; money goes back)")),
      h("label", { for: "resolve-reason" }, "Reason (required)"), reason,
      h("div", { class: "radio-row" }, h("label", {}, force, "force: record even if the account system cannot confirm (only if you are certain)")),
      submit, out);
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var choice = applied.checked ? "APPLIED" : "NOT_APPLIED";
      submit.disabled = true;
      api("/api/v1/admin/transfers/" + encodeURIComponent(row.req_id) + "/resolve", {
        method: "POST", body: { resolution: choice, reason: reason.value.trim(), force: force.checked },
      }).then(function (res) {
        replace(out, h("div", { class: "ok-box" }, "Recorded " + res.resolution + " by " + res.operator + "; the transfer is now " + res.state + (res.pending ? " (a call is still pending)" : "") + "."));
        // The resolution is shown at the top of the page: go there once it is read back.
        setTimeout(function () { reload().then(function () { window.scrollTo(0, 0); }); }, 600);
      }, function (e) { replace(out, errorBox(e)); check(); });
    });
    return card("Resolve this open transfer", form);
  }

  // ---------- one user ----------

  PAGES.user = function (root, r) {
    var id = r.arg;
    var body = h("div", {}, h("div", { class: "muted" }, "Loading…"));
    append(root, [h("h1", {}, "User " + id), body]);
    api("/api/v1/admin/users/" + encodeURIComponent(id)).then(function (u) {
      replace(body, [
        card("Balances", balancesTable(u.balances || [])),
        card("Accounts", accountsTable(u.accounts || [])),
        card("Latest transfers", [transferTable(u.transfers || []), h("p", {}, h("a", { href: "#/transfers?user_id=" + encodeURIComponent(id) }, "All of this user's transfers →"))]),
      ]);
    }, function (e) { replace(body, errorBox(e)); });
  };

  function balancesTable(rows) {
    if (rows.length === 0) { return h("div", { class: "empty" }, "No balance."); }
    return h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "asset"), h("th", { class: "num" }, "FUNDING"), h("th", { class: "num" }, "SPOT"), h("th", { class: "num" }, "in flight"))),
      h("tbody", {}, rows.map(function (b) {
        return h("tr", {}, h("td", {}, b.asset), h("td", { class: "num" }, amount(b.funding)), h("td", { class: "num" }, amount(b.spot)), h("td", { class: "num" }, amount(b.in_flight)));
      })));
  }

  function accountsTable(rows) {
    if (rows.length === 0) { return h("div", { class: "empty" }, "No account."); }
    return h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "account"), h("th", {}, "asset"), h("th", {}, "status"))),
      h("tbody", {}, rows.map(function (a) {
        return h("tr", {}, h("td", {}, a.account_type), h("td", {}, a.asset || "all"),
          h("td", {}, h("span", { class: "pill " + (a.status === "ACTIVE" ? "good" : "bad") }, a.status)));
      })));
  }

  // ---------- conservation ----------

  PAGES.invariant = function (root) {
    var result = h("div");
    var history = h("div", {}, h("div", { class: "muted" }, "Loading…"));
    var running = false;
    function run(full) {
      if (running) { return; }
      running = true;
      replace(result, h("div", { class: "muted" }, (full ? "Running the full check from the start of history…" : "Running the incremental check…")));
      var started = Date.now();
      api("/api/v1/admin/invariant" + (full ? "?full=true" : "")).then(function (rep) {
        replace(result, rep.cells ? cellsReportView(rep, Date.now() - started) : reportView(rep, Date.now() - started));
        showHaltState(rep.halted, null, rep.cells);
        loadHistory();
      }, function (e) { replace(result, errorBox(e)); }).then(function () { running = false; });
    }
    function loadHistory() {
      api("/api/v1/admin/invariant/history?limit=20").then(function (b) { replace(history, historyTable(b.checks || [])); },
        function (e) { replace(history, e.status === 404 ? h("div", { class: "muted" }, "This build keeps no history of checks.") : errorBox(e)); });
    }
    var clear = h("button", { type: "button", class: "danger", id: "clear-halt", hidden: true }, "Clear the halt");
    var clearOut = h("div", {}, h("div", { class: "muted" }, "Reading the halt flag…"));
    // Under a cell map (`cells` given) each cell has its own halt, cleared on its own: one button
    // per halted cell, which names it (`?cell=N`); the API refuses a clear that names none.
    var cellClears = h("div");
    function showHaltState(halted, reason, cells) {
      showHalt(halted, reason);
      if (cells) {
        clear.hidden = true;
        var stopped = cells.filter(function (c) { return c.halted; });
        replace(clearOut, stopped.length ? h("div", { class: "error" }, "Transfers are halted in cell " + stopped.map(function (c) { return c.cell; }).join(", ") + (reason ? ": " + reason : "") + ".")
          : h("div", { class: "ok-box" }, "No cell is halted: transfers are accepted."));
        replace(cellClears, stopped.map(function (c) { return clearCellButton(c.cell); }));
        return;
      }
      clear.hidden = !halted;
      replace(clearOut, halted ? h("div", { class: "error" }, "Transfers are halted" + (reason ? ": " + reason : "") + ".")
        : h("div", { class: "ok-box" }, "Not halted: transfers are accepted."));
    }
    function clearCellButton(cell) {
      var b = h("button", { type: "button", class: "danger", id: "clear-halt-" + cell }, "Clear cell " + cell + "'s halt");
      b.addEventListener("click", function () {
        if (b.getAttribute("data-armed") !== "1") { b.setAttribute("data-armed", "1"); b.textContent = "Confirm: cell " + cell + "'s transfers resume now"; return; }
        api("/api/v1/admin/invariant/clear?cell=" + encodeURIComponent(cell), { method: "POST" }).then(readHalt, function (e) { replace(clearOut, errorBox(e)); });
      });
      return b;
    }
    function readHalt() {
      api("/api/v1/admin/overview").then(function (o) { showHaltState(o.halted, o.halt_reason, o.cells); },
        function (e) { replace(clearOut, errorBox(e)); });
    }
    readHalt();
    clear.addEventListener("click", function () {
      if (clear.getAttribute("data-armed") !== "1") { clear.setAttribute("data-armed", "1"); clear.textContent = "Confirm: transfers resume now"; return; }
      api("/api/v1/admin/invariant/clear", { method: "POST" }).then(function () {
        showHaltState(false, null);
      }, function (e) { replace(clearOut, errorBox(e)); });
    });
    append(root, [h("h1", {}, "Conservation check"),
      card("Run now", [h("p", { class: "muted" }, "Per asset: FUNDING + SPOT + in flight must equal the net external deposits, reconciled per req_id with both account systems' records."),
        h("div", { class: "toolbar" },
          h("button", { type: "button", id: "run-incremental", onclick: function () { run(false); } }, "Run the incremental check now"),
          h("button", { type: "button", id: "run-full", class: "secondary", onclick: function () { run(true); } }, "Run the full check now")),
        result]),
      card("Recent checks", history),
      card("Halt", [h("p", { class: "muted" }, "A violation halts new transfers. Clear it only after you have found the cause."), clearOut, clear, cellClears])]);
    loadHistory();
  };

  // Under a cell map: the verdict over every cell, the per-asset total of their figures, then each
  // cell's own report (a cell that could not answer named as down).
  function cellsReportView(rep, ms) {
    var down = rep.down_cells || [];
    var head = h("p", {}, h("span", { class: "pill " + (rep.ok ? "good" : "bad") }, rep.ok ? "money is conserved in every cell" : (down.length ? "NOT ALL CELLS CHECKED" : "VIOLATION")),
      "  " + rep.cells.length + " cells" + (down.length ? " · down: cell " + down.join(", ") : "") + (ms === null ? "" : " · " + ms + " ms in the browser"));
    var total = rep.total || {};
    var totals = h("table", { id: "invariant-assets" }, h("thead", {}, h("tr", {}, h("th", {}, "asset, all cells"), h("th", { class: "num" }, "deposits"), h("th", { class: "num" }, "FUNDING"),
      h("th", { class: "num" }, "SPOT"), h("th", { class: "num" }, "in flight"), h("th", { class: "num" }, "difference"))),
      h("tbody", {}, Object.keys(total).map(function (asset) {
        var a = total[asset];
        return h("tr", {}, h("td", {}, asset), h("td", { class: "num" }, amount(a.deposits)), h("td", { class: "num" }, amount(a.funding)),
          h("td", { class: "num" }, amount(a.spot)), h("td", { class: "num" }, amount(a.in_flight)), h("td", { class: "num" }, amount(a.difference)));
      })));
    var cells = rep.cells.map(function (c) {
      var title = h("h2", {}, "Cell " + c.cell);
      if (c.state === "down") { return h("div", { class: "cell-report", "data-cell": String(c.cell) }, title, h("div", { class: "error" }, "Cell " + c.cell + " is down: not checked.")); }
      return h("div", { class: "cell-report", "data-cell": String(c.cell) }, title, reportView(c, null, "invariant-assets-cell-" + c.cell));
    });
    return [head, totals].concat(cells);
  }

  function reportView(rep, ms, tableId) {
    var head = h("p", {}, h("span", { class: "pill " + (rep.ok ? "good" : "bad") }, rep.ok ? "money is conserved" : "VIOLATION"),
      "  " + rep.mode + " check at ", when(rep.checked_at), " · " + rep.transfers_checked + " transfers" + (ms === null ? "" : " · " + ms + " ms in the browser"));
    var assets = h("table", { id: tableId || "invariant-assets" }, h("thead", {}, h("tr", {}, h("th", {}, "asset"), h("th", { class: "num" }, "deposits"), h("th", { class: "num" }, "FUNDING"),
      h("th", { class: "num" }, "SPOT"), h("th", { class: "num" }, "in flight"), h("th", { class: "num" }, "difference"), h("th", {}, "result"))),
      h("tbody", {}, (rep.assets || []).map(function (a) {
        return h("tr", {}, h("td", {}, a.asset), h("td", { class: "num" }, amount(a.deposits)), h("td", { class: "num" }, amount(a.funding)),
          h("td", { class: "num" }, amount(a.spot)), h("td", { class: "num" }, amount(a.in_flight)), h("td", { class: "num" }, amount(a.difference)),
          h("td", {}, h("span", { class: "pill " + (a.ok ? "good" : "bad") }, a.ok ? "ok" : "violated")));
      })));
    var dis = rep.disagreements || [];
    return [head, assets, dis.length ? h("div", {}, h("h2", {}, "Transfers whose records disagree"), h("table", {}, h("tbody", {}, dis.map(function (d) {
      return h("tr", {}, h("td", {}, reqLink(d.req_id)), h("td", {}, d.state ? stateBadge(d.state) : "—"), h("td", {}, d.problem));
    })))) : null];
  }

  function historyTable(checks) {
    if (checks.length === 0) { return h("div", { class: "empty" }, "No check recorded yet."); }
    // Under a cell map each check names its cell, and a run's id is its cell's own.
    var cells = checks.some(function (c) { return c.cell !== undefined; });
    return h("table", { id: "invariant-history" }, h("thead", {}, h("tr", {}, cells ? h("th", {}, "cell") : null, h("th", {}, "when"), h("th", {}, "mode"), h("th", { class: "num" }, "took"), h("th", {}, "result"), h("th", {}, "per asset"), h("th", {}, "report"))),
      h("tbody", {}, checks.map(function (c) {
        var link = "#/check/" + encodeURIComponent(c.id) + (c.cell !== undefined ? "?cell=" + encodeURIComponent(c.cell) : "");
        return h("tr", { "data-run": String(c.id) }, cells ? h("td", {}, String(c.cell)) : null, h("td", {}, when(c.at)), h("td", {}, c.mode), h("td", { class: "num" }, c.duration_ms + " ms"),
          h("td", {}, h("span", { class: "pill " + (c.ok ? "good" : "bad") }, c.ok ? "conserved" : "violated")),
          h("td", {}, (c.assets || []).map(function (a) {
            return h("span", { class: "pill " + (a.ok ? "good" : "bad"), title: a.detail || "" }, a.asset + (a.ok ? " ok" : " ✗"));
          })),
          h("td", {}, c.report ? h("a", { class: "report-link", href: link }, "full report") : h("span", { class: "muted" }, "pruned")));
      })));
  }

  // One check's full report, as it was stored when the check ran.
  PAGES.check = function (root, r) {
    var body = h("div", { id: "check-report" }, h("div", { class: "muted" }, "Loading…"));
    var cell = r.params.get("cell");
    append(root, [h("h1", {}, "Conservation check " + r.arg + (cell ? " of cell " + cell : "")), body, h("p", {}, h("a", { href: "#/invariant" }, "← Conservation check"))]);
    api("/api/v1/admin/invariant/runs/" + encodeURIComponent(r.arg) + (cell ? "?cell=" + encodeURIComponent(cell) : "")).then(function (rep) {
      replace(body, card("Full report", reportView(rep, null)));
    }, function (e) { replace(body, e.status === 404 ? h("div", { class: "empty" }, "This check's report has been pruned.") : errorBox(e)); });
  };

  // ---------- assets ----------

  PAGES.assets = function (root) {
    var body = h("div", {}, h("div", { class: "muted" }, "Loading…"));
    append(root, [h("h1", {}, "Assets"), card("Settings (apply to every ledger process within a second)", body)]);
    function load() {
      api("/api/v1/admin/assets").then(function (list) { replace(body, assetsTable(list, load)); }, function (e) { replace(body, errorBox(e)); });
    }
    load();
  };

  function assetsTable(list, reload) {
    return h("table", { id: "assets-table" }, h("thead", {}, h("tr", {}, h("th", {}, "asset"), h("th", {}, "precision"), h("th", {}, "status"),
      h("th", {}, "transfers"), h("th", {}, "min amount"), h("th", {}, "max amount"), h("th", {}, ""))),
      h("tbody", {}, list.map(function (a) { return assetRow(a, reload); })));
  }

  function assetRow(a, reload) {
    var status = h("select", { name: "status" }, ["ACTIVE", "SUSPENDED"].map(function (s) { return h("option", { value: s, selected: a.status === s }, s); }));
    var enabled = h("input", { type: "checkbox", name: "enabled", checked: a.internal_transfer_enabled });
    var min = h("input", { name: "min", class: "mono", size: 16, value: a.min_transfer_amount });
    var max = h("input", { name: "max", class: "mono", size: 16, value: a.max_transfer_amount });
    var out = h("div", { class: "small" });
    var save = h("button", { type: "button" }, "Save");
    save.addEventListener("click", function () {
      save.disabled = true;
      api("/api/v1/admin/assets/" + encodeURIComponent(a.symbol), { method: "PUT", body: {
        precision: a.precision, min_transfer_amount: min.value.trim(), max_transfer_amount: max.value.trim(),
        status: status.value, internal_transfer_enabled: enabled.checked,
      } }).then(function () { reload(); }, function (e) { replace(out, errorBox(e)); save.disabled = false; });
    });
    return h("tr", { "data-asset": a.symbol }, h("td", {}, h("strong", {}, a.symbol)), h("td", { class: "num" }, String(a.precision)),
      h("td", {}, h("span", { class: "pill " + (a.status === "ACTIVE" ? "good" : "bad") }, a.status), " ", status),
      h("td", {}, h("label", { class: "inline" }, enabled, a.internal_transfer_enabled ? " enabled" : " disabled")),
      h("td", {}, min), h("td", {}, max), h("td", {}, save, out));
  }

  // ---------- live feed ----------

  PAGES.feed = function (root) {
    var indicator = live("connecting…");
    var tbody = h("tbody", { id: "feed-rows" });
    var paused = false;
    var pause = h("button", { type: "button", class: "secondary", onclick: function () { paused = !paused; pause.textContent = paused ? "Resume" : "Pause"; } }, "Pause");
    append(root, [h("h1", {}, "Live event feed ", indicator.el),
      card("Events as they are appended (server-sent events; newest on top; the last 200 kept)", [h("p", {}, pause),
        h("table", { id: "feed-table" }, h("thead", {}, h("tr", {}, h("th", { class: "num" }, "position"), h("th", {}, "event"), h("th", {}, "transfer"),
          h("th", {}, "user"), h("th", {}, "at"), h("th", {}, "data"))), tbody)])]);
    var controller = new AbortController();
    cleanups.push(function () { controller.abort(); });
    api("/api/v1/events?limit=1").then(function (b) {
      streamFeed(Math.max(0, (b.head || 0) - 30), controller.signal, indicator, function (e) {
        if (paused) { return; }
        var tr = h("tr", { class: "feed-row-new", "data-req-id": e.aggregate_id }, h("td", { class: "num mono" }, String(e.position)),
          h("td", {}, h("strong", {}, e.event_type)), h("td", {}, e.aggregate_type === "Transfer" ? reqLink(e.aggregate_id) : e.aggregate_id),
          h("td", {}, e.user_id !== null && e.user_id !== undefined ? userLink(e.user_id) : "—"), h("td", {}, when(e.occurred_at)), h("td", {}, eventData(e.payload)));
        tbody.insertBefore(tr, tbody.firstChild);
        while (tbody.children.length > 200) { tbody.removeChild(tbody.lastChild); }
      });
    }, function (e) { indicator.bad(e.toString()); });
  };

  // EventSource cannot send a bearer header, so the stream is read with fetch and parsed here.
  function streamFeed(after, signal, indicator, onEvent) {
    var last = after;
    function connect() {
      if (signal.aborted) { return; }
      fetch("/api/v1/events/stream?after=" + last, { headers: authHeaders({ Accept: "text/event-stream" }), cache: "no-store", credentials: "omit", signal: signal })
        .then(function (res) {
          if (!res.ok) { throw new ApiError(res.status, "HTTP_" + res.status, res.statusText); }
          indicator.ok("live · streaming from position " + last);
          return readEvents(res.body.getReader(), function (id, data) {
            last = Number(id) || last;
            try { onEvent(JSON.parse(data)); } catch (e) { /* a malformed event is skipped */ }
          });
        })
        .catch(function (e) { if (!signal.aborted) { indicator.bad("disconnected (" + String(e) + "); reconnecting…"); } })
        .then(function () { if (!signal.aborted) { setTimeout(connect, 1500); } });
    }
    connect();
  }

  function readEvents(reader, onEvent) {
    var decoder = new TextDecoder();
    var buffer = "";
    function pump() {
      return reader.read().then(function (chunk) {
        if (chunk.done) { return; }
        buffer += decoder.decode(chunk.value, { stream: true }).replace(/\r\n/g, "\n");
        var at;
        while ((at = buffer.indexOf("\n\n")) >= 0) {
          var block = buffer.slice(0, at);
          buffer = buffer.slice(at + 2);
          var id = null;
          var data = [];
          block.split("\n").forEach(function (line) {
            if (line.indexOf("id:") === 0) { id = line.slice(3).trim(); }
            else if (line.indexOf("data:") === 0) { data.push(line.slice(5).replace(/^ /, "")); }
          });
          if (data.length) { onEvent(id, data.join("\n")); }
        }
        return pump();
      });
    }
    return pump();
  }

  // ---------- start ----------

  function tickClock() { $("clock").textContent = utc(new Date().toISOString()); }

  document.addEventListener("DOMContentLoaded", function () {
    $("signin-form").addEventListener("submit", onSignIn);
    $("signout").addEventListener("click", function () { signOut("Signed out; the token is forgotten."); });
    window.addEventListener("hashchange", route);
    tickClock();
    setInterval(tickClock, 1000);
    try { token = sessionStorage.getItem(TOKEN_KEY); } catch (e) { token = null; }
    if (token) { showSignedIn(); route(); } else { signOut(null); }
  });
}());

// ratchet dashboard: runs table, one run's page, two runs side by side. Reads the JSON API below the page's
// own URL (which holds the session token) and polls it, so runs being written update without a reload.
// Every value from a ledger is inserted as text (textContent), never as HTML.
"use strict";
(function () {
  const main = document.getElementById("main");
  const live = document.getElementById("live");
  const COLORS = ["#1a56a6", "#e8710a", "#137333", "#b3261e", "#6b4fbb", "#00838f", "#9e6a03", "#c2185b"];
  let timer = null;
  let route = null; // the current view's token: a poll from a view left behind stops

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }
  function put(el, ...kids) { // replaceChildren without the "null" a missing part would print
    el.replaceChildren(...kids.flat(Infinity).filter((k) => k !== null && k !== undefined && k !== false && k !== ""));
  }
  const isNum = (x) => typeof x === "number" && Number.isFinite(x);
  const fmt = (x, d = 2) => (isNum(x) ? x.toFixed(d) : x === null || x === undefined ? "–" : String(x));
  const int = (x) => (isNum(x) ? Math.round(x).toLocaleString("en-US") : "–");
  const pct = (x) => (isNum(x) ? (100 * x).toFixed(1) + " %" : "–");
  const short = (id) => (id ? String(id).slice(0, 12) : "–");
  function ago(t) {
    if (!isNum(t)) return "–";
    const s = Math.max(0, Date.now() / 1000 - t);
    if (s < 90) return Math.round(s) + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    if (s < 172800) return (s / 3600).toFixed(1) + " h ago";
    return (s / 86400).toFixed(1) + " d ago";
  }
  function when(t) {
    return isNum(t) ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "–";
  }
  async function getJSON(url) {
    const r = await fetch(url, { cache: "no-store", credentials: "same-origin" });
    if (!r.ok) throw new Error(r.status + ": " + (await r.text()).trim());
    return r.json();
  }
  function setLive(ok, text) {
    live.textContent = text;
    live.className = ok ? "" : "stale";
  }
  function schedule(token, fn, ms) {
    if (route === token) timer = setTimeout(fn, ms);
  }
  function statusEl(status, text) {
    return h("span", { class: "status " + (status || "") }, text || status || "–");
  }
  function kv(rows) {
    return h("table", { class: "kv" }, rows.filter((r) => r && r[1] !== undefined && r[1] !== null && r[1] !== "")
      .map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, v))));
  }
  function table(head, rows, opts = {}) {
    return h("table", { id: opts.id },
      h("tr", {}, head.map((c, i) => h("th", { class: (opts.left || []).includes(i) ? "l" : null }, c))),
      rows);
  }
  function diffPre(text) {
    return h("pre", {}, String(text || "").split("\n").map((line) => h("span", {
      class: line.startsWith("@@") ? "hunk" : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : null,
    }, line + "\n")));
  }
  // the share of the env-step budget used; without one, what was used in the task's words ([[word, n], ...])
  function budgetBar(used, budget, unit, counts) {
    if (!isNum(budget) || budget <= 0) {
      return Array.isArray(counts) && counts.length ? counts.map(([w, n]) => int(n) + " " + w).join(" · ")
        : int(used) + " " + (unit || "env steps");
    }
    const f = Math.min(1, used / budget);
    const bar = h("span", { class: "bar" }, h("span", {}));
    bar.firstChild.style.width = (100 * f).toFixed(1) + "%";
    return h("span", {}, bar, pct(used / budget));
  }

  // ---------------------------------------------------------------- router
  function router() {
    clearTimeout(timer);
    route = {};
    const parts = (location.hash || "#/").slice(2).split("/").map((x) => {
      try { return decodeURIComponent(x); } catch (e) { return x; } // a malformed %-escape: taken as written
    });
    if (parts[0] === "run" && parts[1]) runView(parts[1], route);
    else if (parts[0] === "compare" && parts[1] && parts[2]) compareView(parts[1], parts[2], route);
    else runsView(route);
  }
  window.addEventListener("hashchange", router);

  // ---------------------------------------------------------------- runs table
  const runsUI = { sort: "last_activity", desc: true, filter: "", selected: new Set() };
  const RUN_COLS = [
    ["run", "run_id", true], ["status", "status", true], ["task", "task", true], ["policy", "policy_kind", true],
    ["refiners", "refiners", true], ["gens", "generations"], ["start val", "start_validation"],
    ["incumbent val", "incumbent_validation"], ["start test", "start_test"], ["test", "test"],
    ["budget", "budget_frac"], ["last activity", "last_activity"],
  ];

  function runsView(token) {
    let data = null;
    const filter = h("input", { type: "text", id: "filter", placeholder: "filter: run, status, task, policy, refiner",
      value: runsUI.filter, oninput: (e) => { runsUI.filter = e.target.value; render(); } });
    const compare = h("button", { id: "compare", onclick: () => {
      const [a, b] = [...runsUI.selected];
      if (a && b) location.hash = "#/compare/" + encodeURIComponent(a) + "/" + encodeURIComponent(b);
    } }, "compare two selected");
    const where = h("p", { class: "muted" });
    const holder = h("div", { id: "runs" });
    put(main, h("h1", {}, "Runs"), where, h("div", { class: "toolbar" }, filter, compare), holder);

    function cell(r, key) {
      if (key === "run_id") return h("a", { href: "#/run/" + encodeURIComponent(r.run_id) }, r.run_id);
      if (key === "status") return statusEl(r.status, r.status_text);
      if (key === "refiners") return (r.refiners || []).join(", ");
      if (key === "budget_frac") return budgetBar(r.env_steps, r.budget_env_steps, r.cost_unit, r.used);
      if (key === "last_activity") return ago(r.last_activity);
      if (key === "generations") return int(r.generations);
      const v = r[key];
      return isNum(v) ? fmt(v) : v === null || v === undefined ? "–" : String(v);
    }
    function render() {
      if (!data) return;
      const q = runsUI.filter.trim().toLowerCase();
      let rows = data.runs.map((r) => ({ ...r, budget_frac: isNum(r.budget_env_steps) && r.budget_env_steps > 0
        ? r.env_steps / r.budget_env_steps : null }));
      if (q) rows = rows.filter((r) => [r.run_id, r.status, r.task, r.policy_kind, (r.refiners || []).join(" ")]
        .join(" ").toLowerCase().includes(q));
      const k = runsUI.sort, sign = runsUI.desc ? -1 : 1;
      const key = (v) => (v === null || v === undefined ? null : isNum(v) ? v : Array.isArray(v) ? v.join(",") : String(v));
      rows.sort((a, b) => {
        const x = key(a[k]), y = key(b[k]);
        if (x === null) return y === null ? 0 : 1;
        if (y === null) return -1;
        if (typeof x !== typeof y) return (typeof x === "number" ? -1 : 1) * sign;
        return (x < y ? -1 : x > y ? 1 : 0) * sign;
      });
      const head = h("tr", {}, h("th", {}, ""), RUN_COLS.map(([label, key, left]) => h("th", {
        class: "sortable" + (left ? " l" : "") + (k === key ? (runsUI.desc ? " sorted-desc" : " sorted-asc") : ""),
        "data-key": key,
        onclick: () => { runsUI.desc = runsUI.sort === key ? !runsUI.desc : key === "last_activity"; runsUI.sort = key; render(); },
      }, label)));
      const body = rows.map((r) => h("tr", { "data-run": r.run_id },
        h("td", {}, h("input", { type: "checkbox", checked: runsUI.selected.has(r.run_id), onchange: (e) => {
          if (e.target.checked) runsUI.selected.add(r.run_id); else runsUI.selected.delete(r.run_id);
          while (runsUI.selected.size > 2) runsUI.selected.delete([...runsUI.selected][0]);
          render();
        } })),
        RUN_COLS.map(([, key, left]) => h("td", { class: left ? "l" : null }, cell(r, key)))));
      const bad = data.unreadable.length ? h("p", { class: "warn" }, data.unreadable.length + " unreadable: ",
        data.unreadable.map((u) => u.run_id + " (" + u.error + ")").join("; ")) : null;
      put(holder, h("table", { id: "runs-table" }, head, body), bad,
        rows.length ? null : h("p", { class: "muted" }, data.runs.length ? "no run matches the filter" : "no runs yet"));
      compare.disabled = runsUI.selected.size !== 2;
    }
    async function poll() {
      try {
        data = await getJSON("api/runs");
        if (route !== token) return;
        where.textContent = data.runs.length + " run(s) in " + data.where;
        render();
        setLive(true, "live · updated " + new Date().toLocaleTimeString());
      } catch (e) {
        setLive(false, "not updating: " + e.message);
      }
      schedule(token, poll, 3000);
    }
    poll();
  }

  // ---------------------------------------------------------------- one run
  function merge(st, d) {
    if (!st.data || d.gen_from !== st.gens.generation.length) st.gens = d.generations;
    else for (const c of Object.keys(st.gens)) st.gens[c] = st.gens[c].concat(d.generations[c] || []);
    if (!st.data || d.gate_from !== st.gates.length) st.gates = d.gates;
    else st.gates = st.gates.concat(d.gates);
    st.data = d;
  }

  // series: labels, or {label, color, dash, step} (step: a value that holds until it changes, e.g. the incumbent's)
  function chart(title, xLabel, series, yLabel, width) {
    const specs = series.map((s, i) => (typeof s === "string" ? { label: s } : s)).map((s, i) => ({
      label: s.label, stroke: s.color || COLORS[i % COLORS.length], width: 1.5, spanGaps: true, dash: s.dash,
      points: { show: false }, paths: s.step ? uPlot.paths.stepped({ align: 1 }) : undefined,
    }));
    const opts = {
      title: undefined, width: width || 560, height: 240, scales: { x: { time: false } }, legend: { live: false },
      series: [{ label: xLabel }, ...specs],
      axes: [{ label: xLabel, incrs: xLabel === "generation" ? [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000,
        10000, 20000, 50000] : undefined }, { size: 70, label: yLabel }],
    };
    const el = h("div", { class: "chart" }, h("h3", {}, title));
    const u = new uPlot(opts, [[], ...specs.map(() => [])], el);
    return { el, u, labels: specs.map((s) => s.label) };
  }

  function curves(g) {
    const x = g.generation;
    const total = g.env_steps, val = g.validation_env_steps, tr = g.training_env_steps;
    const search = total.map((t, i) => (isNum(t) ? t - (val[i] || 0) - (tr[i] || 0) : null));
    const refiners = [...new Set(g.refiner.filter((r) => r))];
    const counts = Object.fromEntries(refiners.map((r) => [r, 0]));
    const alloc = refiners.map(() => []);
    g.refiner.forEach((r) => {
      if (r in counts) counts[r] += 1;
      refiners.forEach((name, j) => alloc[j].push(counts[name]));
    });
    return {
      returns: [x, g.incumbent_validation_mean, g.best_train_mean, g.incumbent_train_mean],
      steps: [x, total, search, val, tr],
      alloc: [x, ...alloc], refiners,
    };
  }

  function runView(id, token) {
    const st = { data: null, gens: null, gates: [], seq: -1, gatesShown: 50, gensShown: 50, charts: null };
    const sec = {};
    for (const name of ["head", "result", "charts", "breakdown", "gates", "gens", "failures", "params", "code",
      "lineage", "games", "llm", "model", "training", "corrections"]) sec[name] = h("section", { id: "sec-" + name });
    put(main, h("h1", {}, "Run ", h("span", { id: "run-id" }, id)), ...Object.values(sec));
    const diffBox = h("div", { id: "program-diff" });

    function renderCharts() {
      const c = curves(st.gens);
      const unit = st.data.cost_unit || "env steps";
      const training = c.steps[4].some((v) => v);  // training jobs' steps: only refiners that train have them
      const key = c.refiners.join() + "|" + training;
      if (!st.charts || st.charts.key !== key) {
        st.charts = {
          key,
          returns: chart("returns per generation", "generation", [
            { label: "incumbent validation mean", step: true }, "best training mean", "incumbent training mean"],
          "mean " + (st.data.return_name || "return")),
          steps: chart("budget as it grows (cumulative)", "generation", ["total", "search and re-evaluation",
            "validation", ...(training ? ["training jobs"] : [])], unit),
          alloc: c.refiners.length > 1 ? chart("refiner allocation (cumulative)", "generation", c.refiners,
            "generations") : null,
        };
        put(sec.charts, h("h2", {}, "Curves"), h("div", { class: "charts" },
          st.charts.returns.el, st.charts.steps.el, st.charts.alloc ? st.charts.alloc.el : null));
      }
      st.charts.returns.u.setData(c.returns);
      st.charts.steps.u.setData(training ? c.steps : c.steps.slice(0, 4));
      if (st.charts.alloc) st.charts.alloc.u.setData(c.alloc);
    }

    function testRow(label, s) {
      if (!s) return null;
      return h("tr", {}, h("td", { class: "l" }, label), h("td", {}, fmt(s.mean)), h("td", {}, fmt(s.std)),
        h("td", {}, s.success_rate === null || s.success_rate === undefined ? "–" : pct(s.success_rate)),
        h("td", {}, int(s.n)));
    }

    function render() {
      const d = st.data, g = st.gens, n = g.generation.length;
      put(sec.head, kv([
        ["status", statusEl(d.status, d.status_text)],
        ["task", d.task], ["policy kind", d.policy_kind], ["refiners", (d.refiners || []).join(", ")],
        ["generations", h("span", { id: "n-gens" }, String(d.n_generations))],
        ["promotions", String(d.promotions.length)],
        ["budget", isNum((d.budget || {}).env_steps) ? budgetBar(d.env_steps, d.budget.env_steps, d.cost_unit) : null],
        ["used", (d.used || []).map(([w, k]) => int(k) + " " + w).join(" · ")],
        ["incumbent", short(d.incumbent_id) + " (validation mean " + fmt(d.incumbent_validation_mean) + ")"],
        ["stop reason", d.stop_reason], ["error", d.error ? h("span", { class: "error" }, d.error) : null],
        ["next", d.status === "interrupted" || d.status === "stale" || d.status === "failed"
          ? h("code", {}, "ratchet resume " + id) : null],
        ["started", when(d.started_at)], ["last activity", ago(d.last_activity)],
        ["final decision", d.final_decision ? (d.final_decision.promoted ? "promoted · " : "") +
          (d.final_decision.gated === false ? "none (" + (d.final_decision.note || "") + "); the incumbent stands"
            : (d.final_decision.note || "")) : null],
        ["compare", h("a", { href: "#/", title: "tick two runs in the runs table" }, "pick a second run")],
      ]));
      put(sec.result, d.test || d.baseline_test ? h("div", {}, h("h2", {}, "Test split (never used for selection)"),
        table(["policy", "mean", "std", "success", d.episode_unit || "episodes"], [testRow("start", d.baseline_test),
          testRow("refined", d.test)], { left: [0], id: "test-table" })) : "");
      renderCharts();
      const bd = d.env_steps_breakdown;
      put(sec.breakdown, bd ? h("div", {}, h("h2", {}, "Where the " + (d.cost_unit || "env steps") + " went"),
        kv(Object.entries(bd).map(([k, v]) => [k, int(v)])), h("p", { class: "muted" }, "search: candidates' first " +
        "training episodes; re-evaluation: training episodes of candidates already evaluated (the incumbent's " +
        "re-runs, confirmations); validation: the gate's episodes; training: refiners' training jobs; unused: left " +
        "in the budget")) : null,
      h("details", {}, h("summary", {}, "the run's spec"), h("pre", {}, JSON.stringify(d.spec, null, 2))));
      // gate decisions, newest first
      const gates = st.gates.slice(-st.gatesShown).reverse();
      put(sec.gates, h("h2", {}, "Gate decisions (" + d.n_gates + ")"), d.n_gates ? table(
        ["gen", "candidate", "n", "mean diff", "p", "e", "level α", "test", "verdict"],
        gates.map((x) => h("tr", { class: x.promoted ? "promoted" : null }, h("td", {}, x.generation),
          h("td", { class: "l" }, short(x.candidate_id)), h("td", {}, int(x.n)), h("td", {}, fmt(x.mean_diff, 3)),
          h("td", {}, isNum(x.p_value) ? x.p_value.toExponential(2) : "–"), h("td", {}, fmt(x.e_value, 2)),
          h("td", {}, isNum(x.alpha) ? x.alpha.toPrecision(3) : "–"), h("td", { class: "l" }, x.test || "–"),
          h("td", { class: "note" }, (x.promoted ? "promoted: " : "rejected: ") + (x.reason || "")))),
        { id: "gates-table", left: [1, 7, 8] }) : h("p", { class: "muted" }, "no gate has run yet"),
      st.gates.length > st.gatesShown ? h("button", { onclick: () => { st.gatesShown += 500; render(); } },
        "show 500 more") : null);
      // generations: why no gate ran
      const rows = [];
      for (let i = n - 1; i >= Math.max(0, n - st.gensShown); i--) {
        rows.push(h("tr", { class: g.promoted[i] ? "promoted" : null }, h("td", {}, g.generation[i]),
          h("td", { class: "l" }, g.refiner[i] || "–"), h("td", {}, fmt(g.best_train_mean[i])),
          h("td", {}, fmt(g.incumbent_validation_mean[i])), h("td", {}, int(g.env_steps[i])),
          h("td", { class: "note" }, (g.gated[i] ? "gated: " : "no gate: ") + (g.gate_note[i] || ""))));
      }
      put(sec.gens, h("h2", {}, "Generations, newest first"), table(["gen", "refiner", "best train",
        "incumbent val", d.cost_unit || "env steps", "gate"], rows, { id: "gens-table", left: [1, 5] }),
      n > st.gensShown ? h("button", { onclick: () => { st.gensShown += 500; render(); } }, "show 500 more") : null);
      // failure modes
      const fm = d.failure_modes || {};
      const fmBlock = (tag, title) => {
        const modes = fm[tag] || [];
        if (!modes.length) return null;
        const why = modes.some((m) => m.description);  // what sets a mode apart, when the diagnosers found it
        return h("div", {}, h("h3", {}, title),
          table(["failure mode", d.episode_unit || "episodes", "share", "mean " + (d.return_name || "return"), "example seeds",
            ...(why ? ["what sets it apart"] : [])],
            modes.map((m) => h("tr", {}, h("td", { class: "l" }, m.label), h("td", {}, int(m.count)), h("td", {}, pct(m.share)),
              h("td", {}, fmt(m.mean_return, 1)), h("td", { class: "l" }, (m.example_seeds || []).join(", ")),
              why ? h("td", { class: "note" }, m.description || "") : null)), { left: [0, 4, 5] }),
          modes.filter((m) => m.gif).map((m) => h("figure", {}, h("img", { src: m.gif, alt: m.label, loading: "lazy" }),
            h("figcaption", {}, tag + ": " + m.label))));
      };
      const anyModes = (fm.before || []).length || (fm.after || []).length;
      const none = (tag, title) => (fm[tag] || []).length ? null : h("p", { class: "muted" }, title +
        ": no failing test episodes");
      put(sec.failures, anyModes ? h("div", {}, h("h2", {}, "Failure modes on the test split"),
        fmBlock("before", "start") || none("before", "start"), fmBlock("after", "refined") || none("after", "refined"))
        : "");
      // parameter changes
      put(sec.params, d.promotions.length ? h("div", {}, h("h2", {}, "Promotions and parameter changes"),
        table(["gen", "from → to", "validation", "changes"], d.promotions.map((p) => h("tr", {},
          h("td", {}, p.generation), h("td", { class: "l" }, short(p.from) + " → " + short(p.to)),
          h("td", {}, fmt(p.previous_validation_mean) + " → " + fmt(p.validation_mean)),
          h("td", { class: "note" }, p.changes.length ? p.changes.map((c) => c.name + ": " + (c.before ?? "–") + " → " +
            (c.after ?? "–")).join("\n") : p.code ? "code changed (below)" : "–"))), { id: "params-table", left: [1, 3] }))
        : "");
      put(sec.code, (d.code_changes || []).length ? h("div", {}, h("h2", {}, "Code changes promoted"),
        d.code_changes.map((c) => h("div", {}, h("h3", {}, "generation " + c.generation + ": " + short(c.from) + " → " +
          short(c.to)), diffPre(c.structure_diff || c.diff)))) : "");
      if (d.structural) loadLineage(); else put(sec.lineage);
      // games
      const opp = d.test_by_opponent || [];
      put(sec.games, opp.length ? h("div", {}, h("h2", {}, "Test payoff by opponent"),
        table(["opponent", "start", "refined", "W / D / L", "games"], opp.map((o) => h("tr", {},
          h("td", { class: "l" }, o.opponent), h("td", {}, fmt(o.start_mean)), h("td", {}, fmt(o.final_mean)),
          h("td", {}, o.wins + " / " + o.draws + " / " + o.losses), h("td", {}, int(o.n)))), { left: [0] }),
        (d.league || []).length && d.league[0].rows ? h("div", {}, h("h3", {}, "League payoffs (rows: incumbents)"),
          table(["", ...d.league[0].columns], d.league[0].rows.map((r, i) => h("tr", {}, h("td", { class: "l" }, short(r)),
            d.league[0].table[i].map((x) => h("td", {}, fmt(x))))), { left: [0] })) : null) : "");
      // LLM usage
      const llm = Object.entries(d.llm_usage || {});
      put(sec.llm, llm.length || d.rejected_proposals || d.endpoint_failures ? h("div", {},
        h("h2", {}, "LLM usage"), llm.map(([name, u]) => h("div", {}, h("h3", {}, name + (u.model ? " (" + u.model + ")" : "")),
          h("pre", {}, u.text))), h("p", { class: "muted" }, d.rejected_proposals + " rejected proposal(s) · " +
          d.endpoint_failures + " endpoint failure(s)")) : "");
      // [model] screen: the world model's account
      put(sec.model, d.world_model ? h("div", {}, h("h2", {}, "World model"), h("p", {}, d.world_model.text)) : "");
      // training jobs
      const tot = Object.entries((d.training || {}).totals || {});
      put(sec.training, tot.length ? h("div", {}, h("h2", {}, "Training jobs"),
        table(["trainer", "jobs", d.cost_unit || "env steps", "seconds", "errors"], tot.map(([k, t]) => h("tr", {},
          h("td", { class: "l" }, k), h("td", {}, int(t.jobs)), h("td", {}, int(t.env_steps)), h("td", {}, fmt(t.seconds, 1)),
          h("td", {}, int(t.errors)))), { left: [0] }),
        h("h3", {}, "latest jobs"), table(["trainer", "parent", "env steps", "seconds", "outputs", "error"],
          d.training.jobs.slice().reverse().map((j) => h("tr", {}, h("td", { class: "l" }, j.trainer),
            h("td", { class: "l" }, short(j.parent_id)), h("td", {}, int(j.env_steps)), h("td", {}, fmt(j.seconds, 1)),
            h("td", {}, int(j.outputs)), h("td", { class: "note" }, j.error || "")))), { left: [0, 1, 5] }) : "");
      // correction rounds
      const cr = d.corrections || [];
      put(sec.corrections, cr.length ? h("div", {}, h("h2", {}, "Correction rounds"),
        table(["round", "who", "candidate", "episodes", "person steps", "env steps", "status", "verdict"],
          cr.map((c) => h("tr", {}, h("td", {}, c.round), h("td", { class: "l" }, c.who), h("td", { class: "l" }, short(c.candidate_id)),
            h("td", {}, int(c.episodes)), h("td", {}, int(c.person_steps)), h("td", {}, int(c.env_steps)),
            h("td", { class: "l" }, c.status), h("td", { class: "note" }, c.status === "finished"
              ? (c.promoted ? "promoted: " : "not promoted: ") + (c.reason || "") : "")))), { left: [1, 2, 6, 7] }) : "");
    }

    async function loadLineage() {
      let lin;
      try {
        lin = await getJSON("api/runs/" + encodeURIComponent(id) + "/lineage");
      } catch (e) {
        put(sec.lineage, h("h2", {}, "Lineage of programs"), h("p", { class: "error" }, e.message));
        return;
      }
      if (route !== token) return;
      if (!lin.nodes.length) {
        put(sec.lineage, h("h2", {}, "Lineage of programs"), h("p", { class: "muted" }, "no program with changed code yet"));
        return;
      }
      const kids = {};
      const ids = new Set(lin.nodes.map((x) => x.id));
      for (const x of lin.nodes) {
        const parent = ids.has(x.parent_id) ? x.parent_id : "";
        (kids[parent] = kids[parent] || []).push(x);
      }
      const tree = (parent, depth) => h("ul", { class: "tree" }, (kids[parent] || []).map((x) => h("li", {},
        h("a", { onclick: () => showDiff(x.id), "data-program": x.id }, short(x.id)), " ", h("span", { class: "muted" },
          "gen " + x.generation + " · " + (x.refiner || "?")), x.promoted ? h("b", {}, " promoted") : null,
        depth < 60 ? tree(x.id, depth + 1) : null)));
      put(sec.lineage, h("h2", {}, "Lineage of programs (" + lin.total + " with changed code" +
        (lin.total > lin.nodes.length ? "; newest " + lin.nodes.length + " shown" : "") + ")"),
      h("p", { class: "muted" }, "from the start " + short(lin.root) + "; click a program for its diff against its parent"),
      tree("", 0), diffBox);
    }

    async function showDiff(cid) {
      try {
        const p = await getJSON("api/runs/" + encodeURIComponent(id) + "/programs/" + encodeURIComponent(cid));
        put(diffBox, h("h3", {}, short(p.id) + " against " + (p.parent_id ? short(p.parent_id) : "the start") +
          " (" + (p.refiner || "?") + ", generation " + p.generation + ")"), diffPre(p.diff || "(no change)"));
      } catch (e) {
        put(diffBox, h("p", { class: "error" }, e.message));
      }
    }

    async function poll() {
      let wait = 2000;
      try {
        const q = st.data ? "?gen_from=" + st.gens.generation.length + "&gate_from=" + st.gates.length : "";
        const d = await getJSON("api/runs/" + encodeURIComponent(id) + q);
        if (route !== token) return;
        const changed = d.seq !== st.seq || !st.data || d.status !== st.data.status;
        merge(st, d);
        st.seq = d.seq;
        if (changed) render();
        wait = d.status === "running" ? 2000 : 5000;
        setLive(true, "live · " + d.status + " · updated " + new Date().toLocaleTimeString());
      } catch (e) {
        if (route !== token) return;
        if (!st.data) put(main, h("h1", {}, "Run " + id), h("p", { class: "error", id: "error" }, e.message),
          h("p", {}, h("a", { href: "#/" }, "back to the runs")));
        setLive(false, "not updating: " + e.message);
        wait = 5000;
      }
      schedule(token, poll, wait);
    }
    poll();
  }

  // ---------------------------------------------------------------- two runs side by side
  function compareView(a, b, token) {
    const box = h("div", {});
    put(main, h("h1", {}, "Compare ", a, " and ", b), box);
    let c = null;
    function finalParams(d) {
      const out = {};
      for (const p of d.promotions || []) for (const ch of p.changes) out[ch.name] = ch.after;
      return out;
    }
    async function poll() {
      try {
        const [da, db] = await Promise.all([a, b].map((id) => getJSON("api/runs/" + encodeURIComponent(id))));
        if (route !== token) return;
        // one x axis: the union of both runs' env steps (cumulative), each run's incumbent validation mean on it
        const xs = [...new Set([...da.generations.env_steps, ...db.generations.env_steps].filter(isNum))].sort((x, y) => x - y);
        const ys = [da, db].flatMap((d) => {
          const byX = new Map(), byXt = new Map();
          d.generations.env_steps.forEach((x, i) => { byX.set(x, d.generations.incumbent_validation_mean[i]);
            byXt.set(x, d.generations.best_train_mean[i]); });
          return [xs.map((x) => (byX.has(x) ? byX.get(x) : null)), xs.map((x) => (byXt.has(x) ? byXt.get(x) : null))];
        });
        if (!c) {
          c = chart("incumbent validation mean (solid) and best training mean (dashed) vs " + (da.cost_unit || "env steps"),
            da.cost_unit || "env steps", [{ label: a + " validation", color: COLORS[0], step: true },
              { label: a + " best train", color: COLORS[0], dash: [6, 4] },
              { label: b + " validation", color: COLORS[1], step: true },
              { label: b + " best train", color: COLORS[1], dash: [6, 4] }], "mean " + (da.return_name || "return"), 900);
          const warn = da.task !== db.task ? h("p", { class: "warn" }, "different tasks: " + da.task + " and " + db.task) : null;
          const side = h("div", { class: "side", id: "side" });
          put(box, warn, c.el, side);
        }
        c.u.setData([xs, ...ys]);
        const col = (d) => {
          const fp = finalParams(d);
          return h("div", {}, h("h2", {}, h("a", { href: "#/run/" + encodeURIComponent(d.run_id) }, d.run_id)),
            kv([["status", statusEl(d.status, d.status_text)], ["task", d.task], ["policy kind", d.policy_kind],
              ["refiners", (d.refiners || []).join(", ")], ["generations", String(d.n_generations)],
              ["promotions", String(d.promotions.length)], ["incumbent validation", fmt(d.incumbent_validation_mean)],
              ["stop reason", d.stop_reason]]),
            h("h3", {}, "test"), table(["policy", "mean", "std", "success", d.episode_unit || "episodes"],
              [["start", d.baseline_test], ["refined", d.test]].filter(([, s]) => s).map(([l, s]) => h("tr", {},
                h("td", { class: "l" }, l), h("td", {}, fmt(s.mean)), h("td", {}, fmt(s.std)),
                h("td", {}, s.success_rate === null || s.success_rate === undefined ? "–" : pct(s.success_rate)), h("td", {}, int(s.n)))),
            { left: [0] }),
            h("h3", {}, "parameters changed (final values)"), Object.keys(fp).length ? table(["parameter", "value"],
              Object.entries(fp).map(([k, v]) => h("tr", {}, h("td", { class: "l" }, k), h("td", { class: "l" }, v ?? "–"))),
              { left: [0, 1] }) : h("p", { class: "muted" }, "none"));
        };
        put(document.getElementById("side"), col(da), col(db));
        setLive(true, "live · updated " + new Date().toLocaleTimeString());
      } catch (e) {
        if (route !== token) return;
        if (!c) put(box, h("p", { class: "error", id: "error" }, e.message));
        setLive(false, "not updating: " + e.message);
      }
      schedule(token, poll, 3000);
    }
    poll();
  }

  router();
})();

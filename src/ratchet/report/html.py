"""One self-contained HTML report per run (plots embedded as base64 PNG; opens offline)."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ratchet.ledger.projection import RunState, cost_text
from ratchet.safefile import read_bytes, write_bytes
from ratchet.text import clean

__all__ = ["render_report", "write_report"]


_MAX_GIF_BYTES = 64 * 2**20


def _esc(x: object) -> str:
    """HTML-escaped text, with control characters and lone surrogates made visible (:func:`clean`): error
    texts and failure-mode labels come from policy code."""
    return html.escape(clean(x, None))


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _fmt(x, digits: int = 2) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return _esc(x)


def _payoff_table(state: RunState) -> str:
    """A game's test payoffs per opponent, start beside final (:meth:`RunState.test_by_opponent`); "" otherwise."""
    rows = state.test_by_opponent()
    if not rows:
        return ""
    body = "".join(f"<tr><td style='text-align:left'>{_esc(o['opponent'])}</td><td>{o['n']}</td>"
                   f"<td>{_fmt(o['start_mean'])}</td><td>{_fmt(o['final_mean'])}</td>"
                   f"<td>{o['wins']} / {o['draws']} / {o['losses']}</td></tr>" for o in rows)
    out = ("<h2>Test payoff by opponent</h2><p>Mean payoff of the starting policy and of the final incumbent against "
           "each test opponent (worst first), and the final incumbent's wins / draws / losses.</p>"
           "<table><tr><th>opponent</th><th>episodes</th><th>start</th><th>final</th><th>W / D / L</th></tr>"
           f"{body}</table>")
    if state.league and state.league[-1].get("rows"):  # a self-play league: its last payoff table and meta-strategy
        last = state.league[-1]
        weights = last.get("meta_strategy") or {}
        head = "".join(f"<th>{_esc(c)}</th>" for c in last["columns"])
        table = "".join(f"<tr><td style='text-align:left'>{_esc(r)}</td>" + "".join(f"<td>{x:+.2f}</td>" for x in row)
                       + "</tr>" for r, row in zip(last["rows"], last["table"]))
        meta = "".join(f"<td>{weights.get(c, 0.0):.2f}</td>" for c in last["columns"])
        out += (f"<h2>League</h2><p>{len(state.league)} incumbent(s) (the start and each promoted) joined the "
                "training opponents. The league's "
                "payoff table at the last promotion (rows: incumbents, by candidate id; columns: training opponents; "
                "mean training payoff), and the meta-strategy training opponents are drawn from.</p>"
                f"<table><tr><th>incumbent</th>{head}</tr>{table}<tr><td style='text-align:left'><b>meta-strategy</b>"
                f"</td>{meta}</tr></table>")
    return out


def _failure_table(state: RunState, videos: Mapping[str, Path]) -> str:
    esc = _esc
    parts = []
    for tag, title, crit in (("before", "starting policy", state.baseline_test_critique),
                             ("after", "final incumbent", state.test_critique)):
        if crit is None:
            continue
        modes = crit.get("failure_modes", [])
        if not modes:
            summary = state.test if tag == "after" else state.baseline_test
            if summary is not None and summary.get("success_rate") is None:
                from ratchet.critic import NO_SUCCESS_HINT

                parts.append(f"<h3>{title}: no errored test episodes; success is undefined for this task "
                             f"({esc(NO_SUCCESS_HINT)})</h3>")
            else:
                parts.append(f"<h3>{title}: no failing test episodes</h3>")
            continue
        rows = "".join(f"<tr><td style='text-align:left'>{esc(m['label'])}</td><td>{m['count']}</td>"
                       f"<td>{100 * m['share']:.1f} %</td><td>{m['mean_return']:.1f}</td>"
                       f"<td>{esc(', '.join(map(str, m['example_seeds'])))}</td>"
                       f"<td style='text-align:left'>{esc(m.get('description', ''))}</td></tr>" for m in modes)
        parts.append(f"<h3>{title}</h3><table><tr><th>failure mode</th><th>{esc(state.episode_unit)}</th><th>share</th>"
                     f"<th>mean {esc(state.return_name)}</th><th>example seeds</th><th>what sets it apart</th></tr>{rows}</table>")
        gifs = [(label, path) for label, path in videos.items() if label.startswith(tag + ":")]
        for label, path in gifs:
            try:  # a regular file only, never a link's target (the GIF was rendered by policy code's worker)
                data = base64.b64encode(read_bytes(path, _MAX_GIF_BYTES)).decode()
            except OSError:
                continue
            parts.append(f"<figure style='display:inline-block;margin:4px'><img alt='{esc(label)}' "
                         f"src='data:image/gif;base64,{data}'><figcaption>{esc(label)}</figcaption></figure>")
    if not parts:
        return ""
    from ratchet.tasks import success_rule_of

    rule = success_rule_of(state.task, state.spec.get("task"))
    what = f"<p>Episodes that errored or missed success ({esc(rule)}), by how they ended.</p>" if rule else ""
    return "<h2>Failure modes on the test split, before vs after</h2>" + what + "".join(parts)


def render_report(state: RunState, videos: Mapping[str, Path] | None = None,
                  artifacts: Mapping[str, bytes] | None = None) -> str:
    """The report page for a run, as an HTML string.

    Sections: summary (baseline vs final on the test split), incumbent validation score vs env steps,
    test-return distributions before vs after, success rate before vs after, failure modes before vs
    after (with an example GIF per top mode when ``videos`` has one), parameter changes (a network is
    summarised: layer sizes, weight count, norm, and how far it moved; its bytes come from ``artifacts``, by
    digest), lineage of promotions.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    esc = _esc
    parts: list[str] = []
    env_id = state.task_name
    unit, ret = state.cost_unit, state.return_name  # the task's words: env steps and return, an evaluator's own
    on_validation = f" ({state.validation_env_steps:,} on validation)"
    used = " · ".join(f"{n:,} {esc(word)}" + (on_validation if word == unit else "") for word, n in state.used())
    parts.append(f"<h1>ratchet run {esc(state.run_id)}</h1>")
    parts.append(f"<p>{esc(env_id)} · status <b>{esc(state.status)}</b> · stop: {esc(str(state.stop_reason))} · "
                 f"{state.generations} generations · {used} · {state.wall_clock_s:.1f} s run time (start-up and this "
                 "report not counted)</p>")
    if state.env_steps_breakdown:  # as `ratchet show` prints it: training, search, re-evaluation, validation, …
        went = " · ".join(f"{esc(str(k))} {v:,}" for k, v in state.env_steps_breakdown.items() if v is not None)
        parts.append(f"<p>{esc(unit)} went to: {went}</p>")

    # summary table
    summary: list[str] = []
    for label, s in (("starting policy", state.baseline_test), ("final incumbent", state.test)):
        if s:
            sr = "–" if s.get("success_rate") is None else f"{100 * s['success_rate']:.1f} %"
            summary.append(f"<tr><td>{label}</td><td>{s['mean']:.2f}</td><td>{s['std']:.2f}</td><td>{s['n']}</td><td>{sr}</td></tr>")
    if summary:
        from ratchet.tasks import success_rule_of

        rule = success_rule_of(state.task, state.spec.get("task"))
        parts.append(f"<h2>Test split (held out, never used for selection)</h2><table><tr><th></th><th>mean {esc(ret)}"
                     f"</th><th>std</th><th>{esc(state.episode_unit)}</th><th>success rate</th></tr>" + "".join(summary) + "</table>"
                     + (f"<p>success: {esc(rule)}</p>" if rule else ""))

    # incumbent score vs env steps
    if state.generation_log:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        xs = [g["env_steps"] for g in state.generation_log]
        ys = [g["incumbent_validation_mean"] for g in state.generation_log]
        base_val = state.evaluation(state.baseline_id, "validation") if state.baseline_id else None
        if base_val is not None:
            xs, ys = [0, *xs], [base_val.mean, *ys]
        ax.step(xs, ys, where="post",
                label="incumbent (validation mean)", color="C0", lw=2)
        ax.plot([g["env_steps"] for g in state.generation_log], [g["best_train_mean"] for g in state.generation_log], ".", color="C1", alpha=0.6,
                label="best candidate (training seeds)")
        for i, p in enumerate(state.promotions):
            ax.axvline(p["env_steps"], color="C2", alpha=0.3, lw=1, label="promotion" if i == 0 else None)
        ax.set_xlabel(f"{unit} (training + validation)")
        ax.set_ylabel(f"mean {ret}")
        ax.legend(loc="lower right")
        ax.grid(alpha=0.3)
        parts.append(f"<h2>Incumbent score vs {esc(unit)}</h2>" + _png(fig))

    # test distributions and success
    before = state.evaluation(state.baseline_id, "test") if state.baseline_id else None
    after = state.evaluation(state.incumbent_id, "test") if state.incumbent_id else None
    if before is not None and after is not None:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), gridspec_kw={"width_ratios": [3, 1]})
        lo = min(before.returns.min(), after.returns.min())
        hi = max(before.returns.max(), after.returns.max())
        bins = 30 if hi > lo else 1
        axes[0].hist(before.returns, bins=bins, range=(lo, hi + 1e-9), alpha=0.55, label=f"before (mean {before.mean:.1f})")
        axes[0].hist(after.returns, bins=bins, range=(lo, hi + 1e-9), alpha=0.55, label=f"after (mean {after.mean:.1f})")
        axes[0].set_xlabel(f"{ret} (test seeds)")
        axes[0].set_ylabel(state.episode_unit)
        axes[0].legend()
        sb, sa = before.success_rate, after.success_rate
        if sb is not None and sa is not None:
            bars = axes[1].bar(["before", "after"], [100 * sb, 100 * sa], color=["C0", "C1"])
            axes[1].bar_label(bars, fmt="%.1f %%")
            axes[1].set_ylim(0, 110)
            axes[1].set_ylabel("success rate (%)")
        else:
            axes[1].set_axis_off()
        parts.append("<h2>Test returns and success rate, before vs after</h2>" + _png(fig))

    parts.append(_failure_table(state, videos or {}))
    parts.append(_payoff_table(state))

    # parameter changes
    if state.baseline_id and state.incumbent_id:
        parts.append(_policy_changes(state, artifacts or {}))

    failures = state.episode_failures()
    if failures:  # episodes that raised, timed out or failed to load: which candidates, and why
        from ratchet.ledger.projection import episode_failures_text

        lines = episode_failures_text(failures, state.run_id).splitlines()
        parts.append(f"<h2>Failed episodes</h2><p>{esc(lines[0])}</p><ul>"
                     + "".join(f"<li>{esc(line.strip())}</li>" for line in lines[1:-1])
                     + f"</ul><p>{esc(lines[-1])}</p>")
    # a deterministic task's decisions (no statistics), or a hint to declare one
    from ratchet.advice import determinism_notes, run_advice

    notes = determinism_notes(state)
    if notes:
        parts.append("<h2>Determinism</h2><ul>" + "".join(f"<li>{esc(line)}</li>" for line in notes) + "</ul>")
    # what to change, when the run promoted little

    advice = run_advice(state) if state.status == "finished" else []
    if advice:
        parts.append("<h2>Why so few promotions, and what to change</h2><ul>"
                     + "".join(f"<li>{esc(line)}</li>" for line in advice) + "</ul>")
    # lineage
    rows = "".join(f"<tr><td>{p['generation']}</td><td>{p['env_steps']:,}</td><td><code>{esc(p['from'])}</code></td>"
                   f"<td><code>{esc(p['to'])}</code></td><td>{_fmt(p['previous_validation_mean'])} → "
                   f"{_fmt(p['validation_mean'])}</td></tr>" for p in state.promotions)
    gates = {(g["generation"], g["candidate_id"]): g for g in state.gates}
    parts.append(f"<h2>Lineage of promotions ({len(state.promotions)} of {len(gates)} gate decisions)</h2>"
                 "<table><tr><th>generation</th><th>env steps</th><th>from</th><th>to</th><th>validation mean</th></tr>"
                 f"{rows}</table>")
    if state.corrections:  # a person's rounds after the run (ratchet correct)
        rows = "".join(f"<tr><td>{c['round']}</td><td><code>{esc(c['candidate_id'])}</code></td><td>{c['episodes']}</td>"
                       f"<td>{c['person_steps']:,} of {c['env_steps']:,}</td>"
                       f"<td><code>{esc(c.get('student_id') or '–')}</code></td>"
                       f"<td>{'yes' if c.get('promoted') else 'no'}</td>"
                       f"<td>{esc(c.get('reason') or 'not yet retrained and gated')}</td></tr>" for c in state.corrections)
        parts.append("<h2>Correction rounds (a person took over; outside the run's budget)</h2><table><tr><th>round</th>"
                     "<th>played</th><th>episodes</th><th>person steps</th><th>student</th><th>promoted</th>"
                     f"<th>gate</th></tr>{rows}</table>")
    from ratchet.proposals import describe_value_changes

    pre = "<pre style='text-align:left;background:#f8f8f8;padding:.5em;overflow-x:auto'>"
    for prom in state.promotions:  # structural promotions: the code's structure apart from its tuned values
        if prom.get("source_diff"):
            structure, values = prom.get("structure_diff"), describe_value_changes(prom.get("value_changes"))
            if structure is None:  # recorded by an older ratchet: one diff, numbers included
                body = f"{pre}{esc(prom['source_diff'])}</pre>"
            else:
                body = (f"<p class=small>Structure (each default written as TUNED):</p>"
                        f"{pre}{esc(structure or '(none: only tuned values changed)')}</pre>"
                        + (f"<p class=small>Tuned values:</p>{pre}{esc(values)}</pre>" if values else ""))
            parts.append(f"<details open><summary>Code change promoted in generation {prom['generation']} "
                         f"(<code>{esc(prom['from'])}</code> → <code>{esc(prom['to'])}</code>)</summary>"
                         f"{body}</details>")
    if state.llm_usage:  # what each LLM refiner asked its endpoint and spent
        rows = "".join(
            f"<tr><td>{esc(name)}</td><td>{esc(u.get('model') or '–')}</td><td>{u['requests']:,}</td>"
            f"<td>{u['attempts']:,}</td><td>{u['answered']:,}</td><td>{u['prompt_tokens']:,}</td>"
            f"<td>{u['completion_tokens']:,}{' (est.)' if u.get('tokens_estimated') else ''}</td>"
            f"<td>{esc(cost_text(u))}</td><td>{u['seconds']:.1f}</td><td style='text-align:left'>"
            + (esc(", ".join(f"{n}× {r}" for r, n in sorted(u['failures'].items(), key=lambda kv: -kv[1])))
               or "none") + "</td></tr>" for name, u in state.llm_usage.items())
        parts.append("<h2>LLM usage</h2><table><tr><th>refiner</th><th>model</th><th>requests</th>"
                     "<th>HTTP attempts</th><th>answered</th><th>prompt tokens</th><th>answer tokens</th>"
                     f"<th>cost</th><th>seconds</th><th>failed requests</th></tr>{rows}</table>"
                     f"<p class=small>Every prompt and answer: <code>ratchet llm-log {esc(state.run_id)}</code></p>")
    world_model = state.world_model()
    if world_model is not None:  # [model] screen: what it saved and how well it predicted
        from ratchet.ledger.projection import world_model_text

        parts.append(f"<h2>World model</h2><p>{esc(world_model_text(world_model))}</p>")
    if state.rejected_proposals:
        reasons: dict[str, int] = {}
        for r in state.rejected_proposals:
            reasons[str(r.get("reason", ""))[:200]] = reasons.get(str(r.get("reason", ""))[:200], 0) + 1
        rows = "".join(f"<tr><td style='text-align:left'>{esc(k)}</td><td>{n}</td></tr>"
                       for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:20])
        from ratchet.ledger.projection import rejection_counts_text  # counted by kind, as `ratchet show` does

        parts.append(f"<details><summary>{len(state.rejected_proposals)} proposal(s) rejected before any episode "
                     f"or by the cascade ({esc(rejection_counts_text(state.rejection_counts()))})</summary><table><tr>"
                     f"<th>reason</th><th>count</th></tr>{rows}</table></details>")
    if state.endpoint_failures:  # requests that got no answer: the endpoint's failures, not the proposals'
        rows = "".join(f"<tr><td style='text-align:left'>{esc(r['reason'])}</td><td>{r['count']}</td></tr>"
                       for r in state.endpoint_failure_reasons(20))
        parts.append(f"<details open><summary>{len(state.endpoint_failures)} request(s) to the LLM endpoint failed "
                     f"(no answer: HTTP status and the server's message)</summary><table><tr><th>reason</th>"
                     f"<th>count</th></tr>{rows}</table></details>")
    if gates:
        rows = "".join(f"<tr><td>{g['generation']}</td><td><code>{esc(g['candidate_id'])}</code></td>"
                       f"<td>{_fmt(g['mean_diff'])}</td><td>{g['p_value']:.3g}</td><td>{'yes' if g['promoted'] else 'no'}</td>"
                       f"<td>{esc(g['reason'])}</td></tr>" for g in gates.values())
        parts.append("<details><summary>All gate decisions</summary><table><tr><th>generation</th><th>candidate</th>"
                     f"<th>mean gain</th><th>p</th><th>promoted</th><th>reason</th></tr>{rows}</table></details>")
    versions = ", ".join(f"{esc(k)} {esc(v)}" for k, v in state.versions.items())
    parts.append(f"<p class=small>Versions: {versions}</p>")
    style = ("body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}"
             "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
             "th{background:#f4f4f4}img{max-width:100%}.small{font-size:80%;color:#666}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>ratchet {esc(state.run_id)}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>")


def _policy_changes(state: RunState, artifacts: Mapping[str, bytes]) -> str:
    """The "Parameter changes" section: one row per parameter (arrays summarised), then for a policy with
    artifacts (network weights, a residual's correction, an SB3 model) one row per artifact describing it
    before and after (:func:`ratchet.policies.describe_artifact`) instead of its numbers."""
    from ratchet.policies import describe_artifact

    esc = html.escape
    assert state.baseline_id is not None and state.incumbent_id is not None  # the caller checked
    before, after = state.candidates[state.baseline_id], state.candidates[state.incumbent_id]
    b, a = before.get("params", {}), after.get("params", {})
    rows = "".join(_param_row(k, b[k], a.get(k)) for k in b)
    b_art, a_art = before.get("artifacts") or {}, after.get("artifacts") or {}
    for role in dict.fromkeys([*b_art, *a_art]):
        hb, ha = b_art.get(role), a_art.get(role)
        change = "unchanged" if hb == ha else "changed"
        if hb is not None and ha is not None and hb != ha and role != "model" and hb in artifacts and ha in artifacts:
            from ratchet.policies.mlp import difference

            try:
                change = difference(artifacts[hb], artifacts[ha])
            except Exception:  # noqa: BLE001, S110 - a damaged or foreign artifact: say only that it changed
                pass
        rows += (f"<tr><td>{esc(role)}</td><td>{esc(describe_artifact(role, artifacts.get(hb), with_role=False) if hb else '–')}</td>"
                 f"<td>{esc(describe_artifact(role, artifacts.get(ha), with_role=False) if ha else '–')}</td><td>{esc(change)}</td></tr>")
    kind = after.get("kind", "program")
    title = "Parameter changes" if kind == "program" else f"Parameter changes ({esc(kind)} policy)"
    return (f"<h2>{title}</h2><table><tr><th>parameter</th><th>start</th><th>final</th>"
            f"<th>change</th></tr>{rows}</table>")


def _param_row(name: str, start: Any, final: Any) -> str:
    """One table row per parameter; an array is summarised (shape, min/mean/max, norm; the change as the
    norm of the difference and the number of elements that moved) instead of one row per element; an int is
    shown whole, a choice as its literal (the change: ``changed`` or ``unchanged``)."""
    esc = html.escape
    if final is None:
        final = float("nan")
    if isinstance(start, (list, tuple)):
        import numpy as np

        from ratchet.policy import describe_value

        diff = np.asarray(final, dtype=float) - np.asarray(start, dtype=float)
        change = f"norm {float(np.linalg.norm(diff)):.4g} ({int(np.count_nonzero(diff))} of {diff.size} changed)"
        return (f"<tr><td>{esc(name)}</td><td>{esc(describe_value(start))}</td><td>{esc(describe_value(final))}</td>"
                f"<td>{esc(change)}</td></tr>")
    if isinstance(start, (str, bool)) or isinstance(final, (str, bool)):  # a categorical parameter's choice
        from ratchet.policy import describe_value

        change = "unchanged" if type(start) is type(final) and start == final else "changed"
        return (f"<tr><td>{esc(name)}</td><td>{esc(describe_value(start))}</td><td>{esc(describe_value(final))}</td>"
                f"<td>{change}</td></tr>")
    if isinstance(start, int) and isinstance(final, int):  # an int parameter: whole numbers
        return f"<tr><td>{esc(name)}</td><td>{start}</td><td>{final}</td><td>{final - start:+d}</td></tr>"
    return f"<tr><td>{esc(name)}</td><td>{start:.6g}</td><td>{final:.6g}</td><td>{final - start:+.4g}</td></tr>"


def write_report(state: RunState, path: str | Path, videos: Mapping[str, Path] | None = None,
                 artifacts: Mapping[str, bytes] | None = None) -> Path:
    """Write :func:`render_report` to ``path`` (its folder made if missing; mode 0644) and return it (GIFs in
    ``videos`` are embedded).

    Raises:
        OSError: the file cannot be written (a full disk); then ``path`` is left as it was and no partial file is
            left (:func:`ratchet.safefile.write_bytes`).
    """
    out = Path(path)
    write_bytes(out, render_report(state, videos, artifacts).encode(), mode=0o644)
    return out

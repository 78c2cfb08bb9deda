// Episodes: a file (step) picker, a paged and filtered table, the group view (the n attempts of one task side by
// side) and the episode viewer (trajectories by role → LLM calls, completion tokens coloured by logprob).

import { api, fmt, h, hashParams, json, runHref, setHashParams } from "./util.js";

const PAGE = 50;

export async function fileList(run) {
  return (await api("files", { run })).files || [];
}

function filePicker(run, files, current, view = "file") {
  return h("select", { id: "file-picker", dataset: { testid: "file-picker" },
    onchange: (e) => { location.hash = runHref(run, view, e.target.value); } },
  files.map((f) => h("option", { value: f.name, selected: f.name === current },
    `${f.name} (${f.kind}${f.step !== undefined && f.step !== null ? `, step ${f.step}` : ""}, ${f.episodes} episodes)`)));
}

const rewardClass = (r) => (r === null || r === undefined ? "" : r > 0 ? "pos" : "zero");

export async function episodesView(main, run, file, reasons) {
  const files = await fileList(run);
  if (!files.length) {
    main.append(h("p", { class: "muted" }, "This run has no episode files yet."));
    return;
  }
  if (!file || !files.some((f) => f.name === file)) file = files[files.length - 1].name;
  const p = hashParams();
  const state = { q: p.get("q") || "", reward: p.get("reward") || "", reason: p.get("reason") || "",
    offset: Number(p.get("offset") || 0) };
  const search = h("input", { type: "search", id: "episode-search", dataset: { testid: "episode-search" },
    placeholder: "search text…", value: state.q,
    onchange: (e) => setHashParams({ ...state, q: e.target.value, offset: 0 }) });
  const rewardSel = h("select", { id: "reward-filter", dataset: { testid: "reward-filter" },
    onchange: (e) => setHashParams({ ...state, reward: e.target.value, offset: 0 }) },
  [["", "any reward"], ["zero", "zero reward"], ["nonzero", "nonzero reward"]].map(([v, t]) =>
    h("option", { value: v, selected: v === state.reward }, t)));
  const reasonSel = h("select", { id: "reason-filter", dataset: { testid: "reason-filter" },
    onchange: (e) => setHashParams({ ...state, reason: e.target.value, offset: 0 }) },
  h("option", { value: "" }, "any reason"),
  [...new Set([...reasons, state.reason].filter(Boolean))].map((r) =>
    h("option", { value: r, selected: r === state.reason }, r)));
  main.append(h("div", { class: "toolbar" }, filePicker(run, files, file), search, rewardSel, reasonSel,
    h("a", { href: runHref(run, "groups", file), class: "button", dataset: { testid: "groups-link" } }, "groups")));

  const res = await api("episodes", { run, file, offset: state.offset, limit: PAGE, q: state.q,
    reward: state.reward, reason: state.reason });
  const items = res.items || [];
  const rows = items.map((e) => h("tr", { dataset: { index: String(e.index) }, class: e.error ? "has-error" : "" },
    h("td", {}, h("a", { href: runHref(run, "episode", file, e.index), dataset: { testid: "episode-link" } }, `#${e.index}`)),
    h("td", { class: "mono" }, e.task_id ?? ""),
    h("td", { class: `num ${rewardClass(e.reward)}` }, fmt(e.reward)),
    h("td", {}, e.reason ? h("span", { class: "reason" }, e.reason) : ""),
    h("td", { class: "num" }, e.response_tokens ?? ""),
    h("td", { class: "num" }, `${e.n_trajectories ?? ""}/${e.n_steps ?? ""}`),
    h("td", { class: "preview" }, e.error ? h("span", { class: "error-text" }, `error: ${e.error} `) : null,
      e.preview ?? "")));
  const total = res.total ?? items.length;
  const end = state.offset + items.length;
  main.append(
    h("table", { class: "grid", id: "episodes-table", dataset: { testid: "episodes-table", total: String(total) } },
      h("thead", {}, h("tr", {}, ["#", "task", "reward", "reason", "tokens", "traj/calls", "preview"].map((t) =>
        h("th", {}, t)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: "7", class: "muted" }, "no episodes match")))),
    h("div", { class: "pager" },
      h("button", { disabled: state.offset <= 0, dataset: { testid: "prev-page" },
        onclick: () => setHashParams({ ...state, offset: Math.max(0, state.offset - PAGE) }) }, "‹ prev"),
      h("span", { class: "muted" }, total ? `${state.offset + 1}–${end} of ${total}` : "0 of 0"),
      h("button", { disabled: end >= total, dataset: { testid: "next-page" },
        onclick: () => setHashParams({ ...state, offset: state.offset + PAGE }) }, "next ›")));
}

export async function groupsView(main, run, file) {
  const files = await fileList(run);
  if (!file && files.length) file = files[files.length - 1].name;
  main.append(h("div", { class: "toolbar" }, filePicker(run, files, file, "groups"),
    h("a", { href: runHref(run, "file", file), class: "button" }, "episodes")));
  const groups = (await api("groups", { run, file })).groups || [];
  const zero = groups.filter((g) => g.all_zero).length;
  const one = groups.filter((g) => g.all_one).length;
  main.append(h("p", { class: "muted" }, `${groups.length} groups · ${zero} all-zero · ${one} all-one ` +
    "(all-equal groups give GRPO no learning signal)"));
  main.append(h("table", { class: "grid", id: "groups-table", dataset: { testid: "groups-table" } },
    h("thead", {}, h("tr", {}, ["task", "attempts (reward)", "signal", ""].map((t) => h("th", {}, t)))),
    h("tbody", {}, groups.map((g, gi) => h("tr", {},
      h("td", { class: "mono" }, g.task_id ?? ""),
      h("td", {}, g.indices.map((idx, i) => h("a", { href: runHref(run, "episode", file, idx),
        class: `chip ${rewardClass(g.rewards[i])}` }, `#${idx}: ${fmt(g.rewards[i], 2)}`))),
      h("td", {}, g.all_zero ? h("span", { class: "badge status-failed" }, "all zero")
        : g.all_one ? h("span", { class: "badge status-finished" }, "all one") : "mixed"),
      h("td", {}, h("a", { href: runHref(run, "group", file, gi), dataset: { testid: "side-by-side" } },
        "side by side")))))));
}

export async function groupSideBySide(main, run, file, gi) {
  const groups = (await api("groups", { run, file })).groups || [];
  const g = groups[Number(gi)];
  if (!g) {
    main.append(h("p", {}, `no group ${gi} in ${file}`));
    return;
  }
  main.append(h("p", {}, h("a", { href: runHref(run, "groups", file) }, "‹ all groups"),
    ` · task ${g.task_id} · ${g.indices.length} attempts`));
  const eps = await Promise.all(g.indices.map((index) => api("episode", { run, file, index })));
  main.append(h("div", { class: "side-by-side", dataset: { testid: "group-columns" } }, eps.map((ep) => {
    const last = ep.trajectories.flatMap((t) => t.steps).at(-1);
    return h("div", { class: "column" },
      h("div", { class: "column-head" }, h("a", { href: runHref(run, "episode", file, ep.index) }, `#${ep.index}`),
        " reward ", h("b", { class: rewardClass(ep.reward) }, fmt(ep.reward)), ep.reason ? ` · ${ep.reason}` : ""),
      last ? tokensOrText(last) : h("p", { class: "muted" }, "no LLM calls"));
  })));
}

/** logprob → background: red (unlikely) through yellow to green (likely), by probability exp(logprob). */
export function tokenColor(logprob) {
  if (logprob === null || logprob === undefined) return "transparent";
  const p = Math.exp(Math.min(0, logprob));
  return `hsl(${Math.round(120 * p)}, 75%, 82%)`;
}

function tokensOrText(step) {
  const tokens = step.tokens || [];
  if (!tokens.length) return h("pre", { class: "completion" }, step.completion || "");
  const noTexts = tokens.every((t) => t.text === null || t.text === undefined);
  const strip = h("div", { class: "tokens", dataset: { testid: "episode-tokens", count: String(tokens.length) } },
    tokens.map((t) => {
      const text = t.text ?? `⟨${t.id}⟩`;
      const tip = `${JSON.stringify(text)} id ${t.id}` + (t.logprob === null || t.logprob === undefined ? ""
        : ` logprob ${t.logprob.toFixed(4)} (p ${Math.exp(t.logprob).toFixed(3)})`);
      return h("span", { class: "tok", title: tip, style: `background:${tokenColor(t.logprob)}`,
        dataset: { logprob: t.logprob ?? "" } }, text);
    }));
  // without the run's tokenizer the strip shows token ids; the text is still worth reading
  return noTexts ? h("div", {}, h("pre", { class: "completion" }, step.completion || ""), strip) : strip;
}

function message(m, run) {
  const content = typeof m.content === "string" ? m.content : json(m.content);
  // the run's stored images (rllm-media references), served from the run folder: nothing loads from outside
  const images = (m.images || []).map((name) => h("img", { class: "msg-image", alt: "image in this message",
    src: `/api/media?run=${encodeURIComponent(run)}&name=${encodeURIComponent(name)}` }));
  return h("div", { class: `msg role-${m.role}` }, h("div", { class: "msg-role" }, m.role),
    h("pre", {}, content), ...images,
    m.truncated ? h("div", { class: "muted" }, "(cut at 20,000 characters)") : null);
}

/** The environment's side of the episode's tool calls (artifacts.tool_log): what each returned and took. */
function toolLogTable(log) {
  const args = (a) => (typeof a === "string" ? a : JSON.stringify(a));
  return h("section", { class: "tool-log", dataset: { testid: "tool-log", count: String(log.length) } },
    h("h3", {}, `tool calls `, h("span", { class: "muted" }, `(${log.length}, run by the environment)`)),
    h("table", {},
      h("thead", {}, h("tr", {}, ["tool", "arguments", "result", "latency", "via", "error"].map((c) => h("th", {}, c)))),
      h("tbody", {}, log.map((r) => h("tr", { dataset: { testid: "tool-call" } },
        h("td", {}, r.name), h("td", {}, h("code", {}, args(r.arguments))), h("td", {}, `${r.result_chars} chars`),
        h("td", {}, `${(1000 * (r.latency_s || 0)).toFixed(1)} ms`), h("td", {}, r.transport || ""),
        h("td", { class: r.error ? "error-text" : "" }, r.error || ""))))));
}

export async function episodeView(main, run, file, index) {
  const [ep, files] = await Promise.all([api("episode", { run, file, index }), fileList(run)]);
  const i = Number(index);
  const count = files.find((f) => f.name === file)?.episodes ?? Infinity;
  main.append(h("div", { class: "toolbar" },
    h("a", { href: runHref(run, "file", file), class: "button" }, `‹ ${file}`),
    i > 0 ? h("a", { href: runHref(run, "episode", file, i - 1), class: "button" }, "prev") : null,
    i + 1 < count ? h("a", { href: runHref(run, "episode", file, i + 1), class: "button",
      dataset: { testid: "next-episode" } }, "next") : null,
    h("span", { class: "muted" }, `episode ${i + 1} of ${count === Infinity ? "?" : count} in ${file}`)));
  main.append(h("div", { class: "episode-head", id: "episode-head", dataset: { testid: "episode-head" } },
    h("h2", {}, `Episode #${ep.index} · task ${ep.task_id ?? "?"}`),
    h("div", { class: "summary" },
      h("span", { class: "fig" }, h("span", { class: "muted" }, "reward "),
        h("b", { class: rewardClass(ep.reward), dataset: { testid: "episode-reward" } }, fmt(ep.reward))),
      ep.reason ? h("span", { class: "fig" }, h("span", { class: "muted" }, "reason "),
        h("span", { class: "reason", dataset: { testid: "episode-reason" } }, ep.reason)) : null,
      ep.error ? h("span", { class: "fig error-text" }, `error: ${typeof ep.error === "string" ? ep.error : json(ep.error)}`)
        : null),
    ep.metrics && Object.keys(ep.metrics).length ? h("details", {}, h("summary", {}, "metrics"), h("pre", {}, json(ep.metrics)))
      : null,
    h("details", {}, h("summary", {}, "task"), h("pre", {}, json(ep.task))),
    ep.artifacts && ep.artifacts.grading ? h("details", {}, h("summary", {}, "grading"),
      h("pre", { dataset: { testid: "episode-grading" } }, json(ep.artifacts.grading))) : null));
  const toolLog = (ep.artifacts || {}).tool_log;
  if (Array.isArray(toolLog) && toolLog.length) main.append(toolLogTable(toolLog));
  main.append(h("div", { class: "legend muted" }, "completion tokens coloured by logprob: ",
    h("span", { class: "tok", style: `background:${tokenColor(-5)}` }, "unlikely"), " ",
    h("span", { class: "tok", style: `background:${tokenColor(-0.7)}` }, "even"), " ",
    h("span", { class: "tok", style: `background:${tokenColor(0)}` }, "likely"), " (hover a token for its value)"));
  for (const [ti, traj] of (ep.trajectories || []).entries()) {
    const sec = h("section", { class: "trajectory", dataset: { testid: "trajectory" } },
      h("h3", {}, `${traj.name || "trajectory"} `, h("span", { class: "muted" },
        `(trajectory ${ti + 1}, ${traj.steps.length} LLM call(s), reward ${fmt(traj.reward)})`)));
    for (const [si, step] of traj.steps.entries()) {
      sec.append(h("div", { class: "llm-call", dataset: { testid: "llm-call" } },
        h("div", { class: "call-head" }, `call ${si + 1}`,
          h("span", { class: "muted" }, ` · reward ${fmt(step.reward)} · finish ${step.finish_reason ?? "–"}` +
            ` · ${(step.tokens || []).length} tokens`)),
        h("details", { open: (step.messages || []).length <= 3 }, h("summary", {}, `${(step.messages || []).length} messages`),
          (step.messages || []).map((m) => message(m, run))),
        h("div", { class: "msg role-assistant" }, h("div", { class: "msg-role" }, "completion"), tokensOrText(step),
          step.completion_truncated ? h("div", { class: "muted" }, "(cut at 20,000 characters)") : null),
        step.tool_calls && step.tool_calls.length ? h("div", { class: "msg role-tool" },
          h("div", { class: "msg-role" }, "tool calls"), h("pre", {}, json(step.tool_calls))) : null));
    }
    main.append(sec);
  }
  if (!(ep.trajectories || []).length) main.append(h("p", { class: "muted" }, "This episode has no trajectories."));
}

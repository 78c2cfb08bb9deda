// rllm view: the page's entry point and hash router. Routes:
//   #/                              runs list (compare checkboxes)
//   #/compare/ID1,ID2               overlaid curves of chosen runs
//   #/run/ID                        curves (live while the run is running)
//   #/run/ID/file/NAME[?q=&reward=zero|nonzero&reason=R&offset=N]   episodes of one file
//   #/run/ID/episode/NAME/I         one episode        #/run/ID/groups/NAME, #/run/ID/group/NAME/K   groups
//   #/run/ID/diagnosis              zero-reward diagnosis         #/run/ID/config, #/run/ID/log
// IDs and names are URL-encoded (a run id is a path relative to the view root and may hold slashes).

import { diagnosis, diagnosisView } from "./diagnosis.js";
import { episodesView, episodeView, groupSideBySide, groupsView } from "./episodes.js";
import { configView, curvesView, logView, runSummary } from "./run.js";
import { compareView, runs, runsView } from "./runs.js";
import { badge, clearError, h, life, runHref, showError } from "./util.js";

const TABS = [["curves", "Curves"], ["file", "Episodes"], ["groups", "Groups"], ["diagnosis", "Zero-reward diagnosis"],
  ["config", "Config"], ["log", "Log"]];

/** The hash path's segments, still URL-encoded (compare splits its list on "," before decoding). */
function rawRoute() {
  const path = location.hash.replace(/^#/, "").split("?")[0];
  return path.split("/").filter(Boolean);
}

function statusOf(run) {
  let last = null;
  return {
    cached: () => last?.status,
    fresh: async () => {
      last = ((await runs(1500)).runs || []).find((r) => r.id === run) || last;
      return last?.status;
    },
    info: () => last,
  };
}

async function runPage(main, run, tab, args) {
  const status = statusOf(run);
  await status.fresh();
  const info = status.info();
  if (!info) {
    main.append(h("p", {}, `No run ${JSON.stringify(run)} under this view's folder. `, h("a", { href: "#/" }, "All runs")));
    return;
  }
  setCrumbs([["#/", "runs"], [runHref(run), run || "."]]);
  main.append(h("div", { class: "run-head" }, h("h2", { id: "run-title" }, run || "."), badge(info.status),
    runSummary(info)));
  const active = tab === "episode" ? "file" : tab === "group" ? "groups" : tab;
  main.append(h("nav", { class: "tabs" }, TABS.map(([t, label]) => h("a", {
    href: t === "curves" ? runHref(run) : runHref(run, t, ...(["file", "groups"].includes(t) && args[0] ? [args[0]] : [])),
    class: t === active ? "active" : "", dataset: { testid: `tab-${t}` } }, label))));
  const body = h("div", { class: "tab-body", id: "tab-body" });
  main.append(body);
  switch (tab) {
    case "curves": return curvesView(body, run, status);
    case "file": case "episodes": {
      const reasons = await diagnosis(run).then((d) => d.reasons || []).catch(() => []);
      return episodesView(body, run, args[0], reasons);
    }
    case "episode": return episodeView(body, run, args[0], args[1]);
    case "groups": return groupsView(body, run, args[0]);
    case "group": return groupSideBySide(body, run, args[0], args[1]);
    case "diagnosis": return diagnosisView(body, run);
    case "config": return configView(body, run);
    case "log": return logView(body, run, status);
    default: body.append(h("p", {}, `unknown view ${tab}`));
  }
}

function setCrumbs(items) {
  const nav = document.getElementById("crumbs");
  nav.textContent = "";
  for (const [href, label] of items) nav.append(" / ", h("a", { href }, label));
}

let generation = 0;

async function route() {
  life.reset();
  clearError();
  const gen = ++generation;
  const main = document.getElementById("app");
  const fresh = h("main", { id: "app", dataset: { testid: "app", view: "loading" } });
  main.replaceWith(fresh);
  const raw = rawRoute();
  const parts = raw.map(decodeURIComponent);
  setCrumbs([["#/", "runs"]]);
  try {
    if (!parts.length) await runsView(fresh);
    else if (parts[0] === "compare") await compareView(fresh, (raw[1] || "").split(",").filter(Boolean).map(decodeURIComponent));
    else if (parts[0] === "run") await runPage(fresh, parts[1] ?? "", parts[2] || "curves", parts.slice(3));
    else fresh.append(h("p", {}, "Unknown page. ", h("a", { href: "#/" }, "All runs")));
  } catch (err) {
    if (gen === generation) showError(err);
  }
  if (gen === generation) fresh.dataset.view = parts[0] === "run" ? `run-${parts[2] || "curves"}` : parts[0] || "runs";
}

window.addEventListener("hashchange", route);
route();

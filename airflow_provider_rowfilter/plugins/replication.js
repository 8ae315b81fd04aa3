// The Replication page of Airflow's UI (Browse → Replication): a plugin React app (plugins/status_page.py).
//
// Plain JavaScript, no build step: Airflow's UI gives its plugins its own React and Chakra UI
// (globalThis.React, globalThis.ChakraUI, globalThis.ReactRouterDOM), so the page is drawn with the
// UI's components and theme, light or dark. It reads /rowfilter/api/subscriptions (the subscriptions the
// signed-in user may read) and reads it again every 15 seconds. Its actions trigger the factory's skip,
// resync and drop DAGs through Airflow's REST API as the signed-in user.
const React = globalThis.React;
const C = globalThis.ChakraUI;
const Router = globalThis.ReactRouterDOM;
const h = React.createElement;

const REFRESH_MS = 15000;
const VERDICT = {
  broken: { palette: "failed", label: "broken" },
  at_risk: { palette: "failed", label: "at risk" },
  lagging: { palette: "warning", label: "lagging" },
  paused: { palette: "gray", label: "paused" },
  disabled: { palette: "gray", label: "disabled" },
  new: { palette: "info", label: "not subscribed yet" },
  ok: { palette: "success", label: "ok" },
  dropped: { palette: "gray", label: "dropped" },
};
const STATE_PALETTE = { r: "success", s: "info", f: "info", d: "running", i: "gray" };

function api(path) {
  return new URL(path, document.baseURI).href;
}

function seconds(s) {
  if (s === null || s === undefined) return "";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(1)} s`;
  const whole = Math.round(s);
  if (whole < 3600) return `${Math.floor(whole / 60)} min ${whole % 60} s`;
  if (whole < 86400) return `${Math.floor(whole / 3600)} h ${Math.floor((whole % 3600) / 60)} min`;
  return `${Math.floor(whole / 86400)} d ${Math.floor((whole % 86400) / 3600)} h`;
}

function count(n) {
  return n === null || n === undefined ? "" : n.toLocaleString("en-US");
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}

function RouterLink({ to, children, testId }) {
  return h(C.Link, { asChild: true, color: "fg.info", "data-testid": testId },
    h(Router.Link, { to }, children));
}

function taskLogPath(t) {
  const base = `/dags/${encodeURIComponent(t.dag_id)}/runs/${encodeURIComponent(t.run_id)}/tasks/${encodeURIComponent(t.task_id)}`;
  return t.map_index >= 0 ? `${base}/mapped/${t.map_index}` : base;
}

// --- triggering the factory's operations DAGs -------------------------------------------------------------
const OPERATIONS = {
  skip_transaction: {
    title: "Skip a remote transaction",
    action: "Skip transaction",
    what: "ALTER SUBSCRIPTION … SKIP: the next apply drops the remote transaction that finished at this LSN (the one the conflict names), once.",
    fields: [{ name: "lsn", label: "Finish LSN of the transaction", kind: "text" }],
  },
  resync_tables: {
    title: "Empty tables and copy them again",
    action: "Resync tables",
    what: "The tables are EMPTIED (truncated) in the subscriber, sent back to state i and copied again: readers see them empty until the copy ends; the incremental sync then catches them up. To repair them in place instead, the table staying readable, use Reconcile.",
    danger: true,
    confirm: "confirm_empty",
    fields: [{ name: "tables", label: "Tables (schema.table, comma-separated)", kind: "list" },
      { name: "confirm_empty", label: "Yes, empty these tables first", kind: "bool" }],
  },
  reconcile_tables: {
    title: "Reconcile tables in place",
    action: "Reconcile",
    what: "Each table is brought to what a new copy under the current definitions would hold: missing rows inserted, extra ones deleted, different ones updated, range by range; it is never emptied and stays readable.",
    fields: [{ name: "tables", label: "Tables (schema.table, comma-separated; empty: every table)", kind: "list" },
      { name: "dry_run", label: "Dry run: only say what would change", kind: "bool" }],
  },
  refresh: {
    title: "Recreate the slot",
    action: "Recreate slot",
    what: "refresh --recreate-slot --reconcile: a new replication slot on the publisher, and every table the lost slot had positioned reconciled in place against it (never emptied). Without reconcile, those tables are emptied and copied again.",
    fields: [{ name: "recreate_slot", label: "Create a new slot", kind: "bool" },
      { name: "reconcile", label: "Reconcile in place (keep the tables readable)", kind: "bool" }],
  },
  disable_subscription: {
    title: "Pause the subscription",
    action: "Pause",
    what: "ALTER SUBSCRIPTION … DISABLE: every apply applies nothing until it is resumed; the watch DAG's slot guard keeps the slot read into the change log meanwhile.",
    fields: [],
  },
  enable_subscription: {
    title: "Resume the subscription",
    action: "Resume",
    what: "ALTER SUBSCRIPTION … ENABLE: the next apply goes on from where the subscription stopped.",
    fields: [],
  },
  drop_subscription: {
    title: "Drop the subscription",
    action: "Drop subscription",
    what: "DROP SUBSCRIPTION: the slot and the capture publication on the publisher, the state in the subscriber; the subscriber's tables and their data stay.",
    fields: [
      { name: "confirm", label: "Type the subscription's name to drop it", kind: "text" },
      { name: "keep_slot", label: "Leave the publisher alone (its slot keeps retaining WAL)", kind: "bool" },
    ],
  },
};

function TriggerDialog({ request, onClose }) {
  const op = OPERATIONS[request.kind];
  const [values, setValues] = React.useState(request.values);
  const [state, setState] = React.useState({ busy: false, error: null, run: null });
  const dagId = request.dagId;

  async function submit() {
    setState({ busy: true, error: null, run: null });
    const conf = {};
    for (const f of op.fields) {
      const v = values[f.name];
      conf[f.name] = f.kind === "list" ? String(v || "").split(",").map((s) => s.trim()).filter(Boolean)
        : f.kind === "bool" ? Boolean(v) : String(v || "").trim();
    }
    try {
      const response = await fetch(api(`api/v2/dags/${encodeURIComponent(dagId)}/dagRuns`), {
        method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ logical_date: null, conf }),
      });
      const body = await response.json().catch(() => ({}));
      if (!response.ok) {
        const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail || body);
        setState({ busy: false, error: `${response.status}: ${detail}`, run: null });
        return;
      }
      setState({ busy: false, error: null, run: body.dag_run_id });
    } catch (e) {
      setState({ busy: false, error: String(e), run: null });
    }
  }

  const field = (f) => h(C.FieldRoot, { key: f.name, mt: 3 },
    f.kind === "bool"
      ? h(C.SwitchRoot, { checked: Boolean(values[f.name]), onCheckedChange: (e) => setValues({ ...values, [f.name]: e.checked }) },
        h(C.SwitchHiddenInput, { "data-testid": `rowfilter-param-${f.name}` }), h(C.SwitchControl, null, h(C.SwitchThumb)),
        h(C.SwitchLabel, null, f.label))
      : [h(C.FieldLabel, { key: "l" }, f.label),
        h(C.Input, { key: "i", "data-testid": `rowfilter-param-${f.name}`, value: values[f.name] || "", fontFamily: "mono",
          onChange: (e) => setValues({ ...values, [f.name]: e.target.value }) })]);

  return h(C.DialogRoot, { open: true, onOpenChange: (e) => { if (!e.open) onClose(); }, size: "md" },
    h(C.Portal, null,
      h(C.DialogBackdrop),
      h(C.DialogPositioner, null,
        h(C.DialogContent, { "data-testid": "rowfilter-trigger-dialog" },
          h(C.DialogHeader, null, h(C.DialogTitle, null, `${op.title}: ${request.subscription}`)),
          h(C.DialogBody, null,
            h(C.Text, { color: "fg.muted", fontSize: "sm" }, op.what),
            h(C.Text, { mt: 2, fontSize: "sm" }, "Triggers the DAG ", h(C.Code, null, dagId), " with:"),
            op.fields.map(field),
            state.error ? h(C.Text, { mt: 3, color: "fg.error", fontSize: "sm" }, state.error) : null,
            state.run ? h(C.Text, { mt: 3, fontSize: "sm" }, "Triggered: ",
              h(RouterLink, { to: `/dags/${encodeURIComponent(dagId)}/runs/${encodeURIComponent(state.run)}` }, state.run)) : null),
          h(C.DialogFooter, null,
            h(C.Button, { variant: "outline", onClick: onClose }, state.run ? "Close" : "Cancel"),
            state.run ? null : h(C.Button, { colorPalette: request.kind === "drop_subscription" || op.danger ? "danger" : "brand",
              loading: state.busy, onClick: submit, disabled: Boolean(op.confirm && !values[op.confirm]),
              "data-testid": "rowfilter-trigger-submit" }, `Trigger ${op.action.toLowerCase()}`))))));
}

// --- the slot's clock, the schedule's warnings, the watch's check, the standbys -------------------------------
function SlotClock({ view }) {
  const lines = (view.exposures || []).map((e, i) => h(C.Text, { key: `e${i}`, fontSize: "sm",
    color: e.at_risk ? "fg.error" : "fg.muted", "data-testid": "rowfilter-exposure" },
  `${e.at_risk ? "AT RISK: " : ""}its slot would be ${e.said}`));
  const warned = (view.warnings || []).map((w, i) => h(C.Text, { key: `w${i}`, fontSize: "sm", color: "fg.warning",
    "data-testid": "rowfilter-warning" }, `WARNING: ${w}`));
  const check = view.check;
  const checked = check ? [h(C.Text, { key: "c", fontSize: "sm", "data-testid": "rowfilter-check",
    color: check.state === "failed" ? "fg.error" : "fg.muted" },
  check.state === "failed" ? `The watch's lag check failed (${check.end_date}): ${check.problems.join("; ") || "see its log"}`
    : `The watch's lag check passed (${check.end_date})${check.state_said ? `: ${check.state_said}, ${check.reason}` : ""}`)] : [];
  const overdue = view.overdue_run ? [h(C.Text, { key: "o", fontSize: "sm", color: "fg.warning",
    "data-testid": "rowfilter-overdue" }, view.overdue_run)] : [];
  const all = [...lines, ...warned, ...checked, ...overdue];
  return all.length ? h(C.Stack, { gap: 1, mb: 3, "data-testid": "rowfilter-slot-clock" }, all) : null;
}

function StandbyPanel({ standbys }) {
  if (!standbys || !standbys.length) return null;
  return h(DataTable, { testId: "rowfilter-standbys", caption: "Standbys",
    columns: [{ key: "standby", label: "standby", mono: true }, { key: "role", label: "role" },
      { key: "timeline", label: "timeline", numeric: true }, { key: "replayed", label: "replayed", mono: true },
      { key: "said", label: "failover", wrap: true }],
    rows: standbys.map((s) => ({ key: s.standby, standby: s.standby,
      role: h(C.Badge, { colorPalette: s.role === "promoted" ? "info" : s.role === "unreachable" ? "failed" : "gray",
        variant: "subtle" }, s.role === "promoted" ? (s.is_publisher ? "promoted: the publisher" : "promoted") : s.role),
      timeline: s.timeline === null || s.timeline === undefined ? "" : String(s.timeline),
      replayed: s.replayed_lsn || "",
      said: h(C.Text, { fontSize: "xs", color: s.ready || s.is_publisher ? "fg.success" : "fg.error" }, s.summary) })) });
}

// --- one subscription --------------------------------------------------------------------------------------
function Stat({ label, value, help, testId }) {
  return h(C.StatRoot, { "data-testid": testId },
    h(C.StatLabel, null, label),
    h(C.StatValueText, { fontSize: "lg", fontWeight: "semibold" }, value || "—"),
    help ? h(C.StatHelpText, { color: "fg.muted", fontSize: "xs" }, help) : null);
}

function DataTable({ columns, rows, testId, caption }) {
  return h(C.Box, { mt: 4 },
    caption ? h(C.Heading, { as: "h4", size: "sm", mb: 2 }, caption) : null,
    h(C.TableScrollArea, { borderWidth: "1px", borderRadius: "md" },
      h(C.TableRoot, { size: "sm", striped: true, "data-testid": testId },
        h(C.TableHeader, null, h(C.TableRow, null, columns.map((c) =>
          h(C.TableColumnHeader, { key: c.key, textAlign: c.numeric ? "end" : "start", whiteSpace: "nowrap" }, c.label)))),
        h(C.TableBody, null, rows.map((row, i) => h(C.TableRow, { key: row.key || i }, columns.map((c) =>
          h(C.TableCell, { key: c.key, textAlign: c.numeric ? "end" : "start", whiteSpace: c.wrap ? "normal" : "nowrap",
            fontFamily: c.mono ? "mono" : undefined, maxW: c.wrap ? "28rem" : undefined }, row[c.key]))))))));
}

function Subscription({ view, onTrigger, focused }) {
  const verdict = VERDICT[view.health.verdict] || VERDICT.ok;
  const dags = view.dag_ids || {};
  const failed = view.failed_task;
  const erroredTables = view.tables.filter((t) => t.last_error).map((t) => t.table);
  const ask = (kind, values) => onTrigger({ kind, dagId: dags[kind], subscription: view.subscription, values });
  const actions = [];
  if (failed) {
    actions.push(h(C.Button, { key: "log", size: "sm", variant: "outline", colorPalette: "failed", asChild: true },
      h(Router.Link, { to: taskLogPath(failed), "data-testid": "rowfilter-failed-log" }, `Log of the failed task (${failed.task_id})`)));
  }
  const live = !["dropped", "new"].includes(view.health.verdict) && view.tables.length > 0;
  const repair = view.repair;
  if (repair && dags[repair.kind] && view.health.verdict !== "dropped") {  // the one the state calls for, first
    actions.push(h(C.Button, { key: "repair", size: "sm", variant: "solid", colorPalette: "brand", title: repair.why,
      "data-testid": "rowfilter-action-repair", "data-kind": repair.kind, onClick: () => ask(repair.kind, repair.values) },
      repair.label));
  }
  if (dags.skip_transaction && live) {
    if (!repair || repair.kind !== "skip_transaction") {
      actions.push(h(C.Button, { key: "skip", size: "sm", variant: "outline", colorPalette: "gray",
        "data-testid": "rowfilter-action-skip", onClick: () => ask("skip_transaction", { lsn: view.conflict_lsn || "" }) },
        "Skip a transaction…"));
    }
    if (dags.reconcile_tables && (!repair || repair.kind !== "reconcile_tables")) {
      actions.push(h(C.Button, { key: "reconcile", size: "sm", variant: "outline", "data-testid": "rowfilter-action-reconcile",
        onClick: () => ask("reconcile_tables", { tables: erroredTables.join(", "), dry_run: false }) },
        erroredTables.length ? `Reconcile ${erroredTables.join(", ")}…` : "Reconcile tables…"));
    }
    if (view.enabled === false && dags.enable_subscription) {
      actions.push(h(C.Button, { key: "resume", size: "sm", variant: "solid", colorPalette: "brand",
        "data-testid": "rowfilter-action-resume", onClick: () => ask("enable_subscription", {}) }, "Resume (enable)…"));
    } else if (dags.disable_subscription) {
      actions.push(h(C.Button, { key: "pause", size: "sm", variant: "outline", "data-testid": "rowfilter-action-pause",
        onClick: () => ask("disable_subscription", {}) }, "Pause (disable)…"));
    }
    actions.push(h(C.Button, { key: "resync", size: "sm", variant: "outline", colorPalette: "danger",
      "data-testid": "rowfilter-action-resync", onClick: () => ask("resync_tables", { tables: erroredTables.join(", "), confirm_empty: false }) },
      erroredTables.length ? `Empty and resync ${erroredTables.join(", ")}…` : "Empty and resync tables…"));
    actions.push(h(C.Button, { key: "drop", size: "sm", variant: "outline", colorPalette: "danger", "data-testid": "rowfilter-action-drop",
      onClick: () => ask("drop_subscription", { confirm: "", keep_slot: false }) }, "Drop…"));
  }
  const slot = view.slot;
  const slotText = view.slot_error ? "unknown" : !slot ? "" : !slot.exists ? "missing" : bytes(slot.retained_bytes);
  const slotHelp = view.slot_error ? view.slot_error : slot && slot.exists
    ? `${slot.wal_status || "no wal_status"}, ${slot.active ? "read now" : "not read now"}` : null;
  const last = view.last_batch;
  return h(C.CardRoot, { id: `rowfilter-${view.subscription}`, "data-testid": "rowfilter-subscription",
    "data-verdict": view.health.verdict, variant: "outline", borderColor: focused ? "fg.info" : undefined, mb: 6 },
  h(C.CardHeader, { pb: 2 },
    h(C.Flex, { gap: 3, align: "center", wrap: "wrap" },
      h(C.Heading, { as: "h3", size: "lg" }, view.subscription),
      h(C.Badge, { colorPalette: verdict.palette, size: "lg", variant: "solid", "data-testid": "rowfilter-verdict" }, verdict.label),
      view.enabled === false ? h(C.Badge, { colorPalette: "gray", variant: "outline" }, "disabled") : null,
      h(C.Spacer),
      dags.incremental_sync ? h(RouterLink, { to: `/dags/${encodeURIComponent(dags.incremental_sync)}`, testId: "rowfilter-dag-link" },
        dags.incremental_sync) : null),
    h(C.Text, { color: "fg.muted", fontSize: "sm", mt: 1 },
      view.publications.length ? `publications ${view.publications.join(", ")} · ` : "",
      view.schedule ? `schedule ${view.schedule} · ` : "", view.spec_file),
    view.health.reasons.length ? h(C.Stack, { gap: 1, mt: 2, "data-testid": "rowfilter-reasons" },
      view.health.reasons.map((r, i) => h(C.Text, { key: i, fontSize: "sm", fontWeight: "medium",
        color: view.health.verdict === "broken" ? "fg.error" : view.health.verdict === "lagging" ? "fg.warning" : "fg.muted" },
      r))) : null),
  h(C.CardBody, { pt: 2 },
    view.last_error ? h(C.Box, { as: "pre", p: 3, mb: 3, borderRadius: "md", bg: "failed.subtle", color: "failed.fg",
      fontSize: "xs", whiteSpace: "pre-wrap", wordBreak: "break-word", "data-testid": "rowfilter-last-error" }, view.last_error) : null,
    view.error && !view.last_error ? h(C.Box, { as: "pre", p: 3, mb: 3, borderRadius: "md", bg: "failed.subtle",
      color: "failed.fg", fontSize: "xs", whiteSpace: "pre-wrap", wordBreak: "break-word" }, view.error) : null,
    actions.length ? h(C.Wrap, { gap: 2, mb: 4, "data-testid": "rowfilter-actions" }, actions) : null,
    h(SlotClock, { view }),
    view.tables.length || last || slot ? h(C.SimpleGrid, { columns: { base: 2, lg: 4 }, gap: 6, mb: 2 },
      h(Stat, { label: "Last batch", testId: "rowfilter-last-batch", value: last ? `${seconds(last.age_seconds)} ago` : "none yet",
        help: last ? `${last.finished_at}, through ${last.end_lsn || "—"}` : null }),
      h(Stat, { label: "Lag then", value: last && last.lag_seconds !== null ? seconds(last.lag_seconds) : "—",
        help: "behind the publisher when the last batch ran" }),
      h(Stat, { label: "Slot retains", value: slotText, help: slotHelp, testId: "rowfilter-slot" }),
      h(Stat, { label: "Applied through", value: view.applied_lsn, help: view.skip_lsn ? `skip pending at ${view.skip_lsn}` : view.measured_at })) : null,
    view.chart_svg && live ? h(C.Box, { mt: 4, color: "fg.muted", "data-testid": "rowfilter-chart-box",
      dangerouslySetInnerHTML: { __html: view.chart_svg } }) : null,
    view.tables.length ? h(DataTable, { testId: "rowfilter-tables", caption: "Tables",
      columns: [
        { key: "table", label: "table", mono: true }, { key: "state", label: "state" }, { key: "lsn", label: "lsn", mono: true },
        { key: "behind", label: "behind now", numeric: true }, { key: "age", label: "last batch" },
        { key: "copied", label: "rows copied", numeric: true }, { key: "check", label: "last verify / reconcile", wrap: true },
        { key: "error", label: "last error", wrap: true }],
      rows: view.tables.map((t) => ({ key: t.table,
        table: t.filter_changed ? h(C.Flex, { gap: 2, align: "center" }, t.table,
          h(C.Badge, { colorPalette: "warning", variant: "subtle", title: t.filter_changed, "data-testid": "rowfilter-filter-changed" },
            "filter changed")) : t.table,
        check: t.last_check ? h(C.Text, { fontSize: "xs", color: t.last_check.clean ? "fg.success" : "fg.error" },
          t.last_check.said) : t.filter_changed ? h(C.Text, { fontSize: "xs", color: "fg.warning" },
          `${t.filter_changed}: verify or reconcile it`) : "",
        state: h(C.Badge, { colorPalette: STATE_PALETTE[t.state] || "gray", variant: "subtle" }, `${t.state} ${t.label}`),
        lsn: t.lsn || "", behind: t.behind || "", age: t.last_batch_age || "", copied: count(t.rows_copied),
        error: t.last_error ? h(C.Text, { color: "fg.error", fontSize: "xs", title: t.last_error },
          t.last_error.split("\n")[0]) : "" })) }) : null,
    view.batches.length ? h(DataTable, { testId: "rowfilter-batches", caption: "Last batches (newest first)",
      columns: [
        { key: "id", label: "batch", numeric: true }, { key: "finished", label: "finished" }, { key: "end", label: "end lsn", mono: true },
        { key: "changes", label: "changes", numeric: true }, { key: "transactions", label: "transactions", numeric: true },
        { key: "lag", label: "lag then", numeric: true }, { key: "took", label: "took", numeric: true },
        { key: "schema", label: "schema changes" }],
      rows: view.batches.map((b) => ({ key: b.id, id: String(b.id), finished: b.finished_at, end: b.end_lsn || "",
        changes: count(b.changes), transactions: count(b.transactions), lag: seconds(b.lag_seconds),
        took: b.duration_ms === null ? "" : seconds(b.duration_ms / 1000),
        schema: (b.schema || []).length ? h(C.Text, { fontSize: "xs", "data-testid": "rowfilter-batch-schema" },
          b.schema.join("; ")) : "" })) }) : null,
    view.batch_ids_note ? h(C.Text, { mt: 2, fontSize: "xs", color: "fg.muted", "data-testid": "rowfilter-batch-ids" },
      view.batch_ids_note) : null,
    h(StandbyPanel, { standbys: view.standbys })));
}

// --- the page ------------------------------------------------------------------------------------------------
function ReplicationPage() {
  const [views, setViews] = React.useState(null);
  const [error, setError] = React.useState(null);
  const [updated, setUpdated] = React.useState(null);
  const [loading, setLoading] = React.useState(false);
  const [request, setRequest] = React.useState(null);
  const focus = decodeURIComponent((window.location.hash || "").slice(1));

  const load = React.useCallback(async () => {
    setLoading(true);
    try {
      const response = await fetch(api("rowfilter/api/subscriptions"), { credentials: "same-origin" });
      if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
      setViews(await response.json());
      setError(null);
      setUpdated(new Date());
    } catch (e) {
      setError(String(e.message || e));
    } finally {
      setLoading(false);
    }
  }, []);

  React.useEffect(() => {
    load();
    const timer = setInterval(load, REFRESH_MS);
    return () => clearInterval(timer);
  }, [load]);

  React.useEffect(() => {
    if (views && focus) {
      const el = document.getElementById(`rowfilter-${focus}`);
      if (el) el.scrollIntoView({ block: "start" });
    }
  }, [views === null, focus]);

  const counts = {};
  for (const v of views || []) counts[v.health.verdict] = (counts[v.health.verdict] || 0) + 1;
  const order = Object.keys(VERDICT);  // the worst first: an incident's subscription is at the top
  const sorted = (views || []).slice().sort((a, b) =>
    order.indexOf(a.health.verdict) - order.indexOf(b.health.verdict) || a.subscription.localeCompare(b.subscription));
  return h(C.Box, { p: { base: 2, md: 4 }, "data-testid": "rowfilter-page" },
    h(C.Flex, { align: "center", gap: 3, wrap: "wrap", mb: 1 },
      h(C.Heading, { as: "h2", size: "xl" }, "Replication"),
      Object.keys(VERDICT).filter((k) => counts[k]).map((k) =>
        h(C.Badge, { key: k, colorPalette: VERDICT[k].palette, variant: "subtle", "data-testid": `rowfilter-count-${k}` },
          `${counts[k]} ${VERDICT[k].label}`)),
      h(C.Spacer),
      loading ? h(C.Spinner, { size: "sm", color: "fg.muted" }) : null,
      h(C.Text, { fontSize: "sm", color: "fg.muted", "data-testid": "rowfilter-updated" },
        updated ? `updated ${updated.toISOString().slice(11, 19)} UTC · every ${REFRESH_MS / 1000} s` : ""),
      h(C.Button, { size: "sm", variant: "outline", onClick: load, "data-testid": "rowfilter-refresh" }, "Refresh")),
    h(C.Text, { color: "fg.muted", fontSize: "sm", mb: 4 },
      "The DAG factory's subscriptions, read now from their subscribers and publishers: what ",
      h(C.Code, null, "rowfilter status"), " shows. Times are UTC."),
    error ? h(C.AlertRoot, { status: "error", mb: 4 }, h(C.AlertIndicator),
      h(C.AlertContent, null, h(C.AlertTitle, null, "Could not read the subscriptions"), h(C.AlertDescription, null, error))) : null,
    views === null && !error ? h(C.Spinner, { size: "lg" }) : null,
    views && views.length === 0 ? h(C.Text, null, "No subscription you may read.") : null,
    sorted.map((v) => h(Subscription, { key: v.spec_file, view: v, onTrigger: setRequest, focused: v.subscription === focus })),
    request ? h(TriggerDialog, { request, onClose: () => setRequest(null) }) : null);
}

globalThis.AirflowPlugin = ReplicationPage;

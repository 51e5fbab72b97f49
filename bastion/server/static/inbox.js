// Bastion's inbox: countdowns, keyboard shortcuts, filters, picking calls for a bulk deny, and live updates from
// /inbox/events (server-sent events) that add or remove one card at a time. No build step, no framework.
"use strict";

const $ = (selector, root = document) => root.querySelector(selector);
const allCards = () => [...document.querySelectorAll("#cards .card")];
const shownCards = () => allCards().filter((card) => !card.hidden);
const cardOf = (id) => $(`#cards [data-invocation="${CSS.escape(id)}"]`);
const kept = window.sessionStorage; // the filters and the selection, across the page a decision reloads

function tick() {
  const now = Date.now();
  for (const el of document.querySelectorAll("[data-expires-at]")) {
    const left = Math.round((Date.parse(el.dataset.expiresAt) - now) / 1000);
    if (left <= 0) { el.textContent = "expired"; el.classList.add("late"); continue; }
    const m = Math.floor(left / 60), s = left % 60;
    el.textContent = (m ? m + " min " : "") + s + " s left";
    el.classList.toggle("late", left < 60);
  }
}

// -- selection and keyboard shortcuts ---------------------------------------------------------------------------

let selected = null;

function select(card) {
  if (selected) selected.classList.remove("selected");
  selected = card;
  if (!card) return;
  card.classList.add("selected");
  card.scrollIntoView({ block: "nearest" });
  kept.setItem("bastion.selected", String(shownCards().indexOf(card)));
}

function move(step) {
  const shown = shownCards();
  const at = shown.indexOf(selected);
  if (shown.length) select(shown[at < 0 ? 0 : Math.min(Math.max(at + step, 0), shown.length - 1)]);
}

function decide(kind) {
  if (selected) $(`form.${kind}`, selected).requestSubmit();
}

function pick() {
  if (!selected) return;
  const box = $("input[type=checkbox]", selected);
  box.checked = !box.checked;
  picked();
}

function help(show) {
  $("#help").hidden = !show;
}

const KEYS = {
  j: () => move(1),
  k: () => move(-1),
  a: () => decide("approve"),
  d: () => decide("deny"),
  x: pick,
  "/": () => $("#filters input").focus(),
  "?": () => help($("#help").hidden),
  Escape: () => help(false),
};
const TYPING = "input:not([type=checkbox]):not([type=radio]), textarea, select, [contenteditable]";

function onKey(event) {
  if (event.ctrlKey || event.metaKey || event.altKey || !$("#cards")) return;
  if (event.target instanceof Element && event.target.closest(TYPING)) return; // never while typing
  const action = KEYS[event.key];
  if (!action) return;
  event.preventDefault();
  action();
}

// -- filters, picking, counts ------------------------------------------------------------------------------------

function filter() {
  const fields = $("#filters").elements;
  const text = fields.text.value.trim().toLowerCase(), action = fields.action.value, agent = fields.agent.value;
  for (const card of allCards()) {
    card.hidden = Boolean((action && card.dataset.action !== action) || (agent && card.dataset.agent !== agent) ||
      (text && !card.textContent.toLowerCase().includes(text)));
    if (!card.hidden) continue;
    $("input[type=checkbox]", card).checked = false; // a bulk deny denies only what is shown
    if (card === selected) select(null);
  }
  kept.setItem("bastion.filters", JSON.stringify({ text: fields.text.value, action, agent }));
  picked();
}

function offerChoices(card) {
  for (const name of ["action", "agent"]) {
    const choices = $(`#filters select[name=${name}]`), value = card.dataset[name];
    if (![...choices.options].some((option) => option.value === value)) choices.add(new Option(value, value));
  }
}

function picked() {
  const count = document.querySelectorAll("#cards input[type=checkbox]:checked").length;
  $("#picked").textContent = count + " selected";
  $("#bulk").hidden = count === 0;
}

function counted() {
  const count = allCards().length;
  $("#count").textContent = count;
  $("#empty").hidden = count > 0;
}

// -- live updates: one card at a time ------------------------------------------------------------------------------

const settled = new Set(); // decided while its card was being fetched: never shown

async function cardFor(id) {
  const response = await fetch("/inbox/approvals/" + encodeURIComponent(id) + "/card");
  if (!response.ok) return null; // decided or expired meanwhile; an ended session is told by the stream
  const template = document.createElement("template");
  template.innerHTML = await response.text();
  return settled.has(id) ? null : template.content.firstElementChild;
}

async function arrived(id) {
  if (cardOf(id)) return;
  const card = await cardFor(id);
  if (!card || cardOf(id)) return;
  $("#cards").prepend(card);
  offerChoices(card);
  filter();
  counted();
  tick();
}

// One approval of a call that needs several: its card is fetched again ("1 of 2 approvals, by alice"), in place.
async function recorded(invocation) {
  const old = cardOf(invocation.id);
  if (!old) return arrived(invocation.id);
  const card = await cardFor(invocation.id);
  if (!card || !old.isConnected) return;
  const wasSelected = old === selected;
  old.replaceWith(card);
  offerChoices(card);
  if (wasSelected) select(card);
  filter();
  tick();
  $("#live").textContent = `Live: an approval of ${invocation.tool} was recorded just now.`;
}

function decided(invocation) {
  settled.add(invocation.id);
  const card = cardOf(invocation.id);
  if (!card) return;
  const shown = shownCards(), at = shown.indexOf(card);
  if (card === selected) select(shown[at + 1] || shown[at - 1] || null);
  card.remove();
  $("#live").textContent = `Live: ${invocation.tool} ${invocation.status} just now.`;
  counted();
  picked();
}

function follow() {
  const status = $("#live");
  if (!status || !window.EventSource) return;
  // From the ledger event the page was rendered at: what happened while it loaded is announced too. EventSource
  // itself resumes after the last event it heard when it reconnects.
  const after = status.dataset.after;
  const source = new EventSource("/inbox/events" + (after ? "?after=" + encodeURIComponent(after) : ""));
  // A decision sent loads the next page: its stream replaces this one (a principal holds only a few open).
  document.addEventListener("submit", (event) => { if (!event.defaultPrevented) source.close(); });
  source.onopen = () => { status.textContent = "Live: updates appear as they happen."; };
  source.onerror = () => {
    status.textContent = source.readyState === EventSource.CLOSED
      ? "Live updates stopped (has your session ended?): reload the page."
      : "Reconnecting to live updates...";
  };
  source.addEventListener("approval_requested", (event) => arrived(JSON.parse(event.data).invocation.id));
  source.addEventListener("approval_recorded", (event) => recorded(JSON.parse(event.data).invocation));
  source.addEventListener("approval_decided", (event) => decided(JSON.parse(event.data).invocation));
}

// -- start -------------------------------------------------------------------------------------------------------

function start() {
  const filters = $("#filters");
  if (!filters) return;
  const saved = JSON.parse(kept.getItem("bastion.filters") || "{}");
  for (const name of ["text", "action", "agent"]) filters.elements[name].value = saved[name] || "";
  filters.hidden = false;
  filters.addEventListener("input", filter);
  filters.addEventListener("submit", (event) => event.preventDefault());
  filter();
  const at = Number(kept.getItem("bastion.selected") ?? -1), shown = shownCards();
  if (at >= 0 && shown.length) select(shown[Math.min(at, shown.length - 1)]);
  $("#cards").addEventListener("click", (event) => select(event.target.closest(".card")));
  $("#cards").addEventListener("change", picked);
  $("#help-open").addEventListener("click", () => help(true));
  $("#help-close").addEventListener("click", () => help(false));
  $("#help").addEventListener("click", (event) => { if (event.target.id === "help") help(false); });
  document.addEventListener("keydown", onKey);
}

tick();
setInterval(tick, 1000);
start();
follow();

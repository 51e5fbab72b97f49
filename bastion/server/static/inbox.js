// Bastion's inbox: countdowns, and live updates from /inbox/events (server-sent events). No build step.
"use strict";

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

function typing() {
  // Never reload over a reason or a note someone is typing.
  return [...document.querySelectorAll("input[type=text]")].some((input) => input.value !== "");
}

function follow() {
  const status = document.getElementById("live");
  if (!status || !window.EventSource) return;
  // From the ledger event the page was rendered at: what happened while it loaded is announced too. EventSource
  // itself resumes after the last event it heard when it reconnects.
  const after = status.dataset.after;
  const source = new EventSource("/inbox/events" + (after ? "?after=" + encodeURIComponent(after) : ""));
  // A decision being sent reloads the page by itself: no reload of ours may race it (and eat its message).
  document.addEventListener("submit", () => source.close());
  source.onopen = () => { status.textContent = "Live: updates appear as they happen."; };
  source.onerror = () => { status.textContent = "Reconnecting to live updates..."; };
  const changed = (event) => {
    const id = JSON.parse(event.data).invocation.id;
    const shown = document.querySelector(`[data-invocation="${CSS.escape(id)}"]`) !== null;
    // A new call is worth showing; a decision matters only for a call this page still offers to decide.
    if (event.type === "approval_requested" ? shown : !shown) return;
    if (typing()) {
      status.textContent = "New activity: reload the page to see it.";
      status.classList.add("changed");
    } else {
      window.location.reload();
    }
  };
  for (const name of ["approval_requested", "approval_decided"]) {
    source.addEventListener(name, changed);
  }
}

tick();
setInterval(tick, 1000);
follow();

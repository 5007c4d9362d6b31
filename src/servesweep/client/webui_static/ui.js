// servesweep on Locust's main page:
// - an "LLM charts" button in Locust's top bar (in its flow, so it covers none of Locust's own controls) that opens
//   the charts page over the UI;
// - the start form's custom parameters under one heading per group, in the locustfile's order (the ramp first;
//   /servesweep/form.json names the groups), with whole labels above their fields instead of cut ones inside;
// - the users field relabelled (read-only) while the step ramp, a load shape, drives the users;
// - the page brought back to Locust's state when it shows one Locust has left (after a stop, or a start it read
//   as "ready" or the last test's "stopped": Locust's page stays there otherwise, below).
// Locust's page is React's: this only adds nodes beside React's own and re-adds them when React renders anew.
"use strict";
(function () {
  const base = document.currentScript.dataset.base || "";
  const FORM = ".MuiAccordionDetails-root:has([name=rampSteps])";  // the custom parameters' panel

  // Labels of the custom parameters in full, above their fields: MUI's floating labels are one line cut at the
  // field's width, and most of these carry their help text.
  const style = document.createElement("style");
  style.textContent = `
    ${FORM} .MuiInputLabel-root { position: static; transform: none; white-space: normal; overflow: visible;
      text-overflow: clip; max-width: none; margin-bottom: 6px; line-height: 1.35; }
    ${FORM} .MuiOutlinedInput-notchedOutline legend { display: none; }
    ${FORM} .servesweep-group { margin: 8px 0 -12px; font: 600 15px sans-serif;
      border-bottom: 1px solid #bbb; padding-bottom: 2px; }
    #servesweep-charts-button { margin: 0 16px; padding: 6px 12px; font: 600 13px sans-serif; white-space: nowrap;
      background: #fff; color: #1f77b4; border: 0; border-radius: 4px; cursor: pointer; }`;
  document.head.appendChild(style);

  const panel = document.createElement("div");
  panel.id = "servesweep-charts-panel";
  panel.style.cssText = "display:none;position:fixed;inset:72px 16px 16px 16px;z-index:2000;background:#fff;" +
    "border:1px solid #999;box-shadow:0 4px 24px rgba(0,0,0,.3)";
  const frame = document.createElement("iframe");
  frame.title = "LLM charts";
  frame.style.cssText = "width:100%;height:100%;border:0";
  panel.appendChild(frame);
  document.body.appendChild(panel);
  const button = document.createElement("button");
  button.id = "servesweep-charts-button";
  button.type = "button";
  button.textContent = "LLM charts";
  function showCharts(open) {
    if (open && !frame.src) frame.src = base + "/servesweep/charts";
    panel.style.display = open ? "block" : "none";
    button.textContent = open ? "close LLM charts" : "LLM charts";
  }
  button.onclick = () => showCharts(panel.style.display === "none");
  // open again after this script's own reload (followLocust, below)
  const CHARTS_OPEN = "servesweep-charts-open";
  if (sessionStorage.getItem(CHARTS_OPEN)) {
    sessionStorage.removeItem(CHARTS_OPEN);
    showCharts(true);
  }

  // The button sits in the top bar right after Locust's logo (the bar spreads its items apart).
  function placeButton() {
    if (button.isConnected) return;
    const logo = document.querySelector("header .MuiToolbar-root > a");
    if (logo) logo.after(button);
  }

  // The users field: while the form's load shape is the step ramp, the ramp sets the users, not this field.
  function usersField() {
    const shape = document.querySelector("select[name=loadShape]");
    const users = document.querySelector("input[name=userCount]");
    if (!shape || !users) return;
    const label = users.id && document.querySelector(`label[for="${users.id}"]`);
    if (label && !label.dataset.servesweepText) label.dataset.servesweepText = label.textContent;
    const ramp = shape.value === "step-ramp";
    users.readOnly = ramp;
    users.title = ramp ? "the step ramp sets the users (--ramp-steps)" : "";
    users.style.opacity = ramp ? "0.5" : "";
    if (label) label.textContent = ramp ? "Number of users: set by the step ramp (--ramp-steps)" : label.dataset.servesweepText;
  }

  // One heading before the first field of each group; a field is the panel's child that holds the named input.
  let groups = null;
  fetch(base + "/servesweep/form.json", {cache: "no-store"}).then(r => r.json()).then(d => { groups = d.groups; });

  function groupHeadings() {
    const details = groups && document.querySelector(FORM);
    if (!details) return;
    const input = details.querySelector("[name=rampSteps]");
    const list = input.closest(".MuiFormControl-root").parentElement;
    for (const g of groups) {
      const first = g.names.map(n => list.querySelector(`[name="${n}"]`)).find(e => e);
      if (!first) continue;
      let field = first;
      while (field.parentElement !== list) field = field.parentElement;
      const before = field.previousElementSibling;
      if (before && before.dataset.servesweepGroup === g.title) continue;
      const h = document.createElement("div");
      h.className = "servesweep-group";
      h.dataset.servesweepGroup = g.title;
      h.textContent = g.title;
      list.querySelector(`[data-servesweep-group="${CSS.escape(g.title)}"]`)?.remove();
      field.before(h);
    }
  }

  // Locust's page asks Locust for its state (/stats/requests) only while a test spawns or runs (locust issues 2046,
  // 2400): any other state it shows stays until a click or a reload, also when Locust has left it.
  // - A stop ("cleanup" on a local runner, "stopping" on a master, while the users finish within --stop-timeout)
  //   seen by its last poll stays after the test has stopped, without NEW.
  // - A start it read as "ready" or as the last test's "stopped": Locust answers /stats/requests from a cache of
  //   2 s or more (memoize in locust/web.py), shared by every client, and a start with a load shape (the step ramp)
  //   passes through "ready" until the shape's first tick spawns the users (start_shape). Another client's request
  //   at that moment (a second tab, a script polling Locust, this function) makes the page's first poll, 2 s after
  //   the start, read "ready": the page shows the start form while the test runs, and asks no more.
  // While the page shows one of these, ask Locust every 2 s; when the page is behind, reload: the charts come back
  // from Locust's history, the form with the last start's values, the LLM charts open if they were. A start shown
  // as "ready"/"stopped" reloads once two answers in a row found the test going (not an answer that raced the
  // page's own Start).
  const STATES = new Set(["ready", "spawning", "running", "cleanup", "stopping", "stopped"]);
  const GOING = new Set(["spawning", "running", "cleanup", "stopping"]);
  const UNASKED = new Set(["ready", "stopped", "cleanup", "stopping"]);  // shown: Locust's page asks no more
  function behind(shown, locust) {
    if (shown === "cleanup" || shown === "stopping") return locust === "stopped" || locust === "ready";
    if (shown === "ready") return locust === "stopped" || GOING.has(locust);
    return shown === "stopped" && GOING.has(locust);  // Locust's "ready" here: a start's moment (start_shape)
  }
  function shownState() {
    const e = [...document.querySelectorAll("header .MuiTypography-button")].find(e => STATES.has(e.textContent));
    return e ? e.textContent : null;
  }
  let asking = false;
  let suspect = null;  // a "ready"/"stopped" shown while the last answer found a test going
  function followLocust() {
    const shown = shownState();
    if (shown === "spawning" || shown === "running") suspect = null;
    if (!UNASKED.has(shown) || asking) return;
    asking = true;
    fetch(base + "/stats/requests", {cache: "no-store"}).then(r => r.json()).then(d => {
      if (shownState() !== shown) return;  // the page moved meanwhile (its own poll, a click)
      if (!behind(shown, d.state)) {
        suspect = null;
      } else if (shown === "cleanup" || shown === "stopping" || suspect === shown) {
        if (panel.style.display !== "none") sessionStorage.setItem(CHARTS_OPEN, "1");
        location.reload();
      } else {
        suspect = shown;
      }
    }).catch(() => {}).finally(() => { setTimeout(() => { asking = false; }, 2000); });
  }

  function decorate() {
    placeButton();
    usersField();
    groupHeadings();
    followLocust();
  }
  decorate();
  setInterval(decorate, 300);
})();

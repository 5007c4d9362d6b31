// servesweep on Locust's main page:
// - an "LLM charts" button in Locust's top bar (in its flow, so it covers none of Locust's own controls) that opens
//   the charts page over the UI;
// - the start form's custom parameters under one heading per group, in the locustfile's order (the ramp first;
//   /servesweep/form.json names the groups), with whole labels above their fields instead of cut ones inside;
// - the users field relabelled (read-only) while the step ramp, a load shape, drives the users;
// - the page brought back to Locust's state after a stop (Locust's page stays at the stop otherwise, below).
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
  button.onclick = () => {
    const open = panel.style.display === "none";
    if (open && !frame.src) frame.src = base + "/servesweep/charts";
    panel.style.display = open ? "block" : "none";
    button.textContent = open ? "close LLM charts" : "LLM charts";
  };

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

  // Locust's page polls its stats only while a test spawns or runs (locust issues 2046, 2400): once a poll has seen
  // the stop ("cleanup" on a local runner, "stopping" on a master, while the users finish within --stop-timeout),
  // the page shows it for good, without NEW, after the test has stopped. While the page shows a stop, ask Locust;
  // once it has stopped, reload: the charts come back from Locust's history, the form with the last start's values.
  const STOP_SHOWN = new Set(["cleanup", "stopping"]);
  let asking = false;
  function followStop() {
    const shown = [...document.querySelectorAll("header .MuiTypography-button")].some(e => STOP_SHOWN.has(e.textContent));
    if (!shown || asking) return;
    asking = true;
    fetch(base + "/stats/requests", {cache: "no-store"}).then(r => r.json()).then(d => {
      if (d.state === "stopped" || d.state === "ready") location.reload();
    }).catch(() => {}).finally(() => { setTimeout(() => { asking = false; }, 2000); });
  }

  function decorate() {
    placeButton();
    usersField();
    groupHeadings();
    followStop();
  }
  decorate();
  setInterval(decorate, 300);
})();

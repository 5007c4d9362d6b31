// servesweep on Locust's main page: an "LLM charts" button that opens the charts page over the UI, and the start
// form's users field relabelled (read-only) while the step ramp, a load shape, drives the users.
"use strict";
(function () {
  const base = document.currentScript.dataset.base || "";
  const panel = document.createElement("div");
  panel.id = "servesweep-charts-panel";
  panel.style.cssText = "display:none;position:fixed;inset:48px 16px 16px 16px;z-index:2000;background:#fff;" +
    "border:1px solid #999;box-shadow:0 4px 24px rgba(0,0,0,.3)";
  const frame = document.createElement("iframe");
  frame.title = "LLM charts";
  frame.style.cssText = "width:100%;height:100%;border:0";
  panel.appendChild(frame);
  const button = document.createElement("button");
  button.id = "servesweep-charts-button";
  button.textContent = "LLM charts";
  button.style.cssText = "position:fixed;right:16px;bottom:16px;z-index:2001;padding:6px 12px;font:600 13px sans-serif;" +
    "background:#1f77b4;color:#fff;border:0;border-radius:4px;cursor:pointer";
  button.onclick = () => {
    const open = panel.style.display === "none";
    if (open && !frame.src) frame.src = base + "/servesweep/charts";
    panel.style.display = open ? "block" : "none";
    button.textContent = open ? "close LLM charts" : "LLM charts";
  };
  document.body.appendChild(panel);
  document.body.appendChild(button);

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
  setInterval(usersField, 500);
})();

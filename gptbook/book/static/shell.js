// The shell of every widget; gptbook/book/widgets.py writes the HTML around it. It finds its widget by id, reads
// the widget's JSON data, wires the controls, and calls the widget's draw(values) at the start and after every
// change. It defines no global name: the site loads require.js, and a page may hold several widgets.
(function (id, make) {
  "use strict";
  var root = document.getElementById(id);
  if (!root || root.getAttribute("data-live") === "1") return;  // the same output shown twice runs once
  root.setAttribute("data-live", "1");
  var data = JSON.parse(root.querySelector("script.gbw-data").textContent);
  var inputs = Array.prototype.slice.call(root.querySelectorAll("[data-control]"));
  var handlers = {};
  function values() {  // every control's value by name: a number for a slider, a string for a choice
    var v = {};
    inputs.forEach(function (el) { v[el.name] = el.type === "range" ? Number(el.value) : el.value; });
    return v;
  }
  function readout(el) {  // a slider's <output>: its value at the step's precision, or "off"
    var out = root.querySelector('output[for="' + el.id + '"]'), off = el.getAttribute("data-off");
    var digits = (String(el.step || "1").split(".")[1] || "").length;
    var isOff = off !== null && Number(off) === Number(el.value);
    if (out) out.textContent = isOff ? "off" : Number(el.value).toFixed(digits);
  }
  var ui = {
    set: function (name, value) { root.querySelector('[name="' + name + '"]').value = value; update(); },
    on: function (name, fn) { handlers[name] = fn; },
    fill: function (slots) {  // Python wrote the status line's words once; only its data-slot spans change
      Object.keys(slots).forEach(function (name) {
        root.querySelectorAll('[data-slot="' + name + '"]').forEach(function (el) { el.textContent = slots[name]; });
      });
    }
  };
  var draw = make(root, data, ui);
  function update() {
    inputs.forEach(function (el) { if (el.type === "range") readout(el); });
    draw(values());
  }
  inputs.forEach(function (el) { el.addEventListener("input", update); el.addEventListener("change", update); });
  root.querySelectorAll("button[data-action]").forEach(function (b) {
    b.addEventListener("click", function () {
      var fn = handlers[b.getAttribute("data-action")];
      if (fn) fn(values());
    });
  });
  root.classList.add("gbw-live");
  update();
})

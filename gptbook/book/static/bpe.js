// The BPE stepper (chapter 1): a sentence's tokens after the first n merges. Python drew the first picture and,
// in a <template>, one span per token id (its text and colour); this script lays out step n's ids as copies of
// those spans, outlines the tokens of the latest merge, and fills the numbers of the status line.
(function (root, data, ui) {
  "use strict";
  var steps = data.steps, box = root.querySelector(".gbw-tokens"), proto = {};
  root.querySelector("template.gbw-protos").content.querySelectorAll(".gbw-tok").forEach(function (el) {
    proto[el.getAttribute("data-id")] = el;
  });
  var none = root.querySelector(".gbw-if-none"), latest = root.querySelector(".gbw-if-merge");
  function at(n) {  // the index of the last step at or below n merges
    var s = 0;
    while (s + 1 < steps.length && steps[s + 1][0] <= n) s++;
    return s;
  }
  function count(n) { return n.toLocaleString("en-US"); }
  function text(id) { return proto[id].textContent; }
  ui.on("prev", function (v) {
    var s = at(v.merges);
    ui.set("merges", steps[v.merges > steps[s][0] ? s : Math.max(s - 1, 0)][0]);
  });
  ui.on("next", function (v) { ui.set("merges", steps[Math.min(at(v.merges) + 1, steps.length - 1)][0]); });
  return function (v) {
    var s = at(v.merges), ids = steps[s][1], m = data.merge[steps[s][0]], tokens = document.createDocumentFragment();
    ids.forEach(function (id) {
      var el = proto[id].cloneNode(true);
      if (m && id === m[2]) el.classList.add("gbw-new");
      tokens.appendChild(el);
    });
    box.textContent = "";
    box.appendChild(tokens);
    box.setAttribute("data-ids", ids.join(","));
    none.hidden = Boolean(m);
    latest.hidden = !m;
    ui.fill({merges: count(v.merges), tokens: ids.length, ratio: (data.n_bytes / ids.length).toFixed(2)});
    if (m) ui.fill({number: count(steps[s][0]), a: text(m[0]), b: text(m[1]), made: text(m[2])});
  };
})

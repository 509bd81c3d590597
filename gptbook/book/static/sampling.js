// The sampling lab (chapter 9): gptbook.sample.filter_logits, in the page. Python drew the first picture (at the
// sliders' first settings), one bar row per likely token; this script filters the chosen prompt's logits at the
// sliders' settings, moves the bars (drawn to the scale of the longest, the row maximum) and fills the numbers of
// the status line. tests/test_widgets.py checks, in Chromium, that it keeps the tokens filter_logits keeps, with
// the same probabilities.
(function (root, data, ui) {
  "use strict";
  var W = 250, rows = root.querySelectorAll(".gbw-row");
  data.prompts.forEach(function (p) {  // JSON has no -Infinity: a masked token's logit comes as null
    p.logits = p.logits.map(function (x) { return x === null ? -Infinity : x; });
  });
  function larger(a, b) { return a < b ? 1 : a > b ? -1 : 0; }  // for sort: largest first, -Infinity too
  function descending(z) {  // indices by logit, largest first, ties in vocabulary order (torch's stable sort)
    return z.map(function (_, i) { return i; }).sort(function (a, b) { return larger(z[a], z[b]) || a - b; });
  }
  function softmax(z) {
    var m = Math.max.apply(null, z), e = z.map(function (x) { return Math.exp(x - m); });
    var s = e.reduce(function (a, b) { return a + b; }, 0);
    return e.map(function (x) { return x / s; });
  }
  function filtered(z, v) {  // gptbook.sample.filter_logits: temperature, top-k, top-p, min-p, in that order
    var zmax = Math.max.apply(null, z), t = v.temperature, out = z.map(function (x) {
      if (t === 0) return x < zmax ? -Infinity : x;
      var s = x - zmax;
      return s === 0 ? s : s / t;
    });
    var kth = out.slice().sort(larger)[Math.min(v.top_k, out.length) - 1];
    out = out.map(function (x) { return x < kth ? -Infinity : x; });
    if (v.top_p < 1) {
      var order = descending(out), p = softmax(order.map(function (i) { return out[i]; })), before = 0;
      order.forEach(function (i, r) { if (before >= v.top_p) out[i] = -Infinity; before += p[r]; });
    }
    if (v.min_p > 0) {
      var top = Math.max.apply(null, out), floor = Math.log(v.min_p);
      out = out.map(function (x) { return x - top < floor ? -Infinity : x; });
    }
    return out;
  }
  return function (v) {
    var z = data.prompts[Number(v.prompt)].logits, order = descending(z);
    var out = filtered(z, v), probs = softmax(out), ref = softmax(z);
    var kept = order.filter(function (i) { return out[i] > -Infinity; }), longest = 0;
    rows.forEach(function (_, r) { longest = Math.max(longest, probs[order[r]], ref[order[r]]); });
    rows.forEach(function (row, r) {
      var i = order[r], on = out[i] > -Infinity;
      row.setAttribute("data-id", i);
      row.setAttribute("data-p", probs[i]);
      row.classList.toggle("gbw-off", !on);
      row.querySelector(".gbw-label").textContent = data.tokens[i];
      row.querySelector(".gbw-ref").setAttribute("width", (ref[i] / longest * W).toFixed(1));
      row.querySelector(".gbw-bar").setAttribute("width", (probs[i] / longest * W).toFixed(1));
      row.querySelector(".gbw-val").textContent = on ? probs[i].toFixed(4) : "removed";
    });
    root.setAttribute("data-kept", kept.join(","));
    ui.fill({kept: kept.length, p: probs[kept[0]].toFixed(4), ref: ref[kept[0]].toFixed(4)});
  };
})

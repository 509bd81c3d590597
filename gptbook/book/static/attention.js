// The attention explorer (chapter 3): one causal attention row at a time. Python drew the tokens as focusable
// spans, shaded by the last token's row in layer 0, head 0; this script reshades them for the chosen layer, head
// and query token (the mouse or the arrow keys choose it) and fills the numbers of the status line.
(function (root, data, ui) {
  "use strict";
  var box = root.querySelector(".gbw-tokens"), spans = Array.prototype.slice.call(box.querySelectorAll(".gbw-tok"));
  var T = spans.length, query = Number(box.getAttribute("data-query")), current = {};
  function row(v, q) {  // the query's weights over keys 0..q, from the packed lower triangle
    var flat = data.weights[Number(v.layer) * data.n_heads + Number(v.head)], start = q * (q + 1) / 2;
    return flat.slice(start, start + q + 1).map(function (x) { return x / 1e4; });
  }
  function pick(q, focus) {
    query = Math.max(0, Math.min(T - 1, q));
    draw(current);
    if (focus) spans[query].focus();
  }
  spans.forEach(function (el, j) {
    el.addEventListener("mouseenter", function () { pick(j, false); });
    el.addEventListener("focus", function () { if (query !== j) pick(j, false); });
    el.addEventListener("keydown", function (e) {
      var to = {ArrowLeft: j - 1, ArrowRight: j + 1, ArrowUp: j - 1, ArrowDown: j + 1, Home: 0, End: T - 1}[e.key];
      if (to === undefined) return;
      e.preventDefault();
      pick(to, true);
    });
  });
  function draw(v) {
    current = v;
    var w = row(v, query), top = Math.max.apply(null, w), best = w.indexOf(top);
    spans.forEach(function (el, j) {
      var seen = j <= query;
      el.classList.toggle("gbw-query", j === query);
      el.classList.toggle("gbw-future", !seen);
      el.tabIndex = j === query ? 0 : -1;
      el.style.setProperty("--w", seen ? (w[j] / (top || 1)).toFixed(3) : "0");  // a zero row: no shade
      if (seen) el.setAttribute("data-w", w[j].toFixed(4)); else el.removeAttribute("data-w");
    });
    box.setAttribute("data-query", query);
    ui.fill({
      layer: Number(v.layer), head: Number(v.head), query: query, token: spans[query].textContent,
      top: top.toFixed(4), best: best, best_token: spans[best].textContent, count: query + 1,
      sum: w.reduce(function (a, b) { return a + b; }, 0).toFixed(3)
    });
  }
  return draw;
})

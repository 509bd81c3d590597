// The RoPE dial (chapter 4): each pair of q and k as two arrows on a dial. Python drew the dials at the first
// positions; this script turns pair i of q by m * theta_i and of k by n * theta_i, as apply_rope does, and fills
// the score q . k of the turned vectors into the status line.
(function (root, data, ui) {
  "use strict";
  var dials = root.querySelectorAll(".gbw-dial"), q = data.q, k = data.k, theta = data.theta, scale = data.scale;
  function rotated(x, i, pos) {  // pair i of x turned by the angle pos * theta_i, as apply_rope does
    var c = Math.cos(pos * theta[i]), s = Math.sin(pos * theta[i]), a = x[2 * i], b = x[2 * i + 1];
    return [a * c - b * s, a * s + b * c];
  }
  function point(line, xy, r) {
    line.setAttribute("x2", (Number(line.getAttribute("x1")) + xy[0] / scale * r).toFixed(2));
    line.setAttribute("y2", (Number(line.getAttribute("y1")) - xy[1] / scale * r).toFixed(2));
  }
  return function (v) {
    var n = v.position, m = n + v.offset, score = 0;
    dials.forEach(function (g, i) {
      var qi = rotated(q, i, m), ki = rotated(k, i, n), r = Number(g.querySelector("circle").getAttribute("r"));
      score += qi[0] * ki[0] + qi[1] * ki[1];
      point(g.querySelector(".gbw-q"), qi, r);
      point(g.querySelector(".gbw-k"), ki, r);
    });
    root.setAttribute("data-score", score);
    ui.fill({m: m, n: n, offset: v.offset, score: score.toFixed(6)});
  };
})

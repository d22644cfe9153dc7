// Interactivity of the plan report: hover tooltips and a click-to-select detail panel for
// graph nodes, and folding of layer lanes. Data comes from the #plan-data JSON block.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("plan-data").textContent);
  var nodes = data.nodes;
  var axes = data.axes;
  var tip = document.getElementById("tooltip");
  var panel = document.getElementById("detail");

  function ms(s) { return (s * 1e3).toFixed(3) + " ms"; }
  function size(b) {
    var units = [["TiB", Math.pow(2, 40)], ["GiB", Math.pow(2, 30)], ["MiB", Math.pow(2, 20)],
                 ["KiB", 1024]];
    for (var k = 0; k < units.length; k++) {
      if (Math.abs(b) >= units[k][1]) { return (b / units[k][1]).toFixed(2) + " " + units[k][0]; }
    }
    return Math.round(b) + " B";
  }
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) { e.textContent = text; }
    if (cls) { e.className = cls; }
    return e;
  }
  function chips(placements) {
    var span = el("span");
    placements.split(",").forEach(function (p, k) {
      var c = el("span", p, p === "R" ? "chip light" : "chip");
      c.style.background = data.colours[p] || "#999";
      c.title = (axes[k] || "axis " + k) + ": " + p;
      span.appendChild(c);
    });
    return span;
  }
  function row(table, label, value) {
    var tr = el("tr");
    tr.appendChild(el("th", label));
    var td = el("td");
    if (typeof value === "string") { td.textContent = value; } else { td.appendChild(value); }
    tr.appendChild(td);
    table.appendChild(tr);
  }
  function graphNode(i) { return document.querySelector('#graph .node[data-i="' + i + '"]'); }

  function showTip(i, evt) {
    var n = nodes[i];
    tip.textContent = "";
    tip.appendChild(el("b", n.op));
    tip.appendChild(el("div", n.name + (n.module ? "  (" + n.module + ")" : "")));
    var p = el("div", "out ");
    p.appendChild(chips(n.output));
    tip.appendChild(p);
    tip.appendChild(el("div", "compute " + ms(n.compute_s) + " · comm " + ms(n.comm_s) +
                              " · " + size(n.memory_bytes)));
    tip.hidden = false;
    moveTip(evt);
  }
  function moveTip(evt) {
    var x = Math.min(evt.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    tip.style.left = x + "px";
    tip.style.top = (evt.clientY + 14) + "px";
  }
  function hideTip() { tip.hidden = true; }

  function select(i, reveal) {
    document.querySelectorAll("#graph .selected, #graph .linked").forEach(function (e) {
      e.classList.remove("selected", "linked");
    });
    document.querySelectorAll("#graph .edge.active").forEach(function (e) {
      e.classList.remove("active");
    });
    var g = graphNode(i);
    if (g) {
      g.classList.add("selected");
      if (reveal) {
        g.closest("details").open = true;
        g.scrollIntoView({block: "center"});
      }
    }
    document.querySelectorAll('#graph .edge[data-from="' + i + '"], #graph .edge[data-to="' +
                              i + '"]').forEach(function (e) { e.classList.add("active"); });
    render(nodes[i]);
  }

  function render(n) {
    panel.textContent = "";
    panel.appendChild(el("h2", n.name));
    var t = el("table");
    t.id = "detail-table";
    row(t, "op", n.op);
    row(t, "role", n.role);
    row(t, "module", n.module || "(top)");
    row(t, "layer", n.layer);
    row(t, "axes", axes.join(", "));
    n.inputs.forEach(function (p, k) { row(t, "input " + k, chips(p)); });
    row(t, "output", chips(n.output));
    if (n.pieces) { row(t, "uneven pieces", n.pieces); }
    if (n.compression) { row(t, "compressed", n.compression); }
    row(t, "compute", ms(n.compute_s));
    row(t, "comm", ms(n.comm_s));
    row(t, "memory", size(n.memory_bytes));
    panel.appendChild(t);
    panel.appendChild(el("h3", "Transfers (" + n.transfers.length + ")"));
    if (!n.transfers.length) {
      panel.appendChild(el("p", "none: this node's inputs arrive where it needs them", "dim"));
    } else {
      var tt = el("table");
      tt.id = "detail-transfers";
      var head = el("tr");
      ["collective", "axis", "pass", "tensor", "bytes", "time"].forEach(function (h) {
        head.appendChild(el("th", h));
      });
      tt.appendChild(head);
      n.transfers.forEach(function (x) {
        var tr = el("tr");
        tr.appendChild(el("td", x.kind));
        tr.appendChild(el("td", x.axis));
        tr.appendChild(el("td", x.backward ? "backward" : "forward"));
        var td = el("td");
        var source = data.index[x.tensor];
        if (source !== undefined) {
          var a = el("a", x.tensor);
          a.addEventListener("click", function () { select(source, true); });
          td.appendChild(a);
          var g = graphNode(source);
          if (g) { g.classList.add("linked"); }
        } else {
          td.textContent = x.tensor;
        }
        tr.appendChild(td);
        tr.appendChild(el("td", size(x.nbytes)));
        tr.appendChild(el("td", ms(x.seconds)));
        tt.appendChild(tr);
      });
      panel.appendChild(tt);
    }
    if (n.formula) {
      panel.appendChild(el("h3", "Cost formula (s)"));
      panel.appendChild(el("div", n.formula, "formula"));
    }
  }

  document.querySelectorAll("#graph .node").forEach(function (g) {
    var i = Number(g.getAttribute("data-i"));
    g.addEventListener("mouseenter", function (e) { showTip(i, e); });
    g.addEventListener("mousemove", moveTip);
    g.addEventListener("mouseleave", hideTip);
    g.addEventListener("click", function () { select(i, false); });
    g.addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); select(i, false); }
    });
  });
  function fold(open) {
    document.querySelectorAll("#graph details.lane").forEach(function (d) { d.open = open; });
  }
  document.getElementById("expand-all").addEventListener("click", function () { fold(true); });
  document.getElementById("collapse-all").addEventListener("click", function () { fold(false); });
})();

// The critique browser of report.html. Model text is only ever written with textContent, never
// as HTML, so a response holding a script element or an onerror attribute shows as text.
(function () {
  "use strict";
  var entries = JSON.parse(document.getElementById("wim-data").textContent);
  var list = document.getElementById("entries");
  var domain = document.getElementById("f-domain");
  var kind = document.getElementById("f-kind");
  var text = document.getElementById("f-text");
  var count = document.getElementById("shown-count");

  function el(tag, cls, content) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (content !== undefined && content !== null) node.textContent = String(content);
    return node;
  }
  function num(v) { return (typeof v === "number") ? v.toFixed(2) : "n/a"; }

  function scoreTable(side) {
    var cols = [["rating", side.rating === null || side.rating === undefined ? "n/a" : side.rating],
                ["numeric", num(side.numeric)], ["similarity", num(side.similarity)],
                ["WIM", num(side.wim)], ["mixed", num(side.mixed)],
                ["ranking score", num(side.score)]];
    var table = el("table", "scores");
    var head = el("tr"), body = el("tr");
    cols.forEach(function (c) {
      head.appendChild(el("th", null, c[0]));
      body.appendChild(el("td", null, c[1]));
    });
    table.appendChild(head);
    table.appendChild(body);
    return table;
  }

  function sideBox(side) {
    var box = el("div", "side" + (side.parse_ok ? "" : " failed"));
    box.appendChild(el("h4", null, side.label + (side.parse_ok ? "" : " \u2014 judgement failed to parse")));
    box.appendChild(el("div", "label", "response"));
    box.appendChild(el("pre", "response", side.response));
    box.appendChild(el("div", "label", "critique (what is missing)"));
    box.appendChild(el("pre", "critique", side.critique === null ? "(none)" : side.critique));
    if (!side.parse_ok) {
      box.appendChild(el("div", "label", "parse error: " + (side.parse_error || "unknown")));
      box.appendChild(el("pre", "raw", side.raw === null ? "(no text)" : side.raw));
    }
    box.appendChild(scoreTable(side));
    return box;
  }

  function card(entry) {
    var art = el("article", "entry");
    art.dataset.kind = entry.kind;
    art.dataset.domain = entry.domain;
    art.dataset.tie = entry.tie ? "1" : "0";
    art.dataset.failed = entry.failed ? "1" : "0";
    var head = el("header");
    head.appendChild(el("span", "badge kind-" + entry.kind, entry.kind));
    if (entry.tie) head.appendChild(el("span", "badge tie", "tie"));
    if (entry.numeric_tie) head.appendChild(el("span", "badge numeric-tie", "numeric tie"));
    if (entry.failed) head.appendChild(el("span", "badge failure", "parse failure"));
    head.appendChild(el("span", "meta", (entry.domain || "(no domain)") + " \u00b7 " + entry.prompt_id));
    art.appendChild(head);
    art.appendChild(el("pre", "prompt", entry.prompt));
    var sides = el("div", "sides");
    entry.sides.forEach(function (s) { sides.appendChild(sideBox(s)); });
    art.appendChild(sides);
    if (entry.failures.length) {
      var more = el("details", "failures");
      more.appendChild(el("summary", null, entry.failures.length + " more failed judgement(s) of this prompt"));
      var inner = el("div", "sides");
      entry.failures.forEach(function (s) { inner.appendChild(sideBox(s)); });
      more.appendChild(inner);
      art.appendChild(more);
    }
    var haystack = [entry.prompt, entry.domain, entry.prompt_id];
    entry.sides.concat(entry.failures).forEach(function (s) {
      haystack.push(s.response, s.critique, s.raw, s.parse_error);
    });
    art.dataset.search = haystack.filter(function (x) { return x; }).join("\n").toLowerCase();
    return art;
  }

  var cards = entries.map(card);
  var fragment = document.createDocumentFragment();
  cards.forEach(function (c) { fragment.appendChild(c); });
  list.appendChild(fragment);

  function matches(c) {
    var d = c.dataset;
    if (domain.value && d.domain !== domain.value) return false;
    var k = kind.value;
    if (k === "pair" && d.kind !== "pair") return false;
    if (k === "tie" && d.tie !== "1") return false;
    if (k === "failed" && d.failed !== "1") return false;
    if (k === "clean" && (d.tie === "1" || d.failed === "1")) return false;
    var q = text.value.trim().toLowerCase();
    return !q || d.search.indexOf(q) !== -1;
  }

  function update() {
    var shown = 0;
    cards.forEach(function (c) {
      var ok = matches(c);
      c.hidden = !ok;
      if (ok) shown += 1;
    });
    count.textContent = shown + " of " + cards.length + " shown";
  }
  [domain, kind].forEach(function (x) { x.addEventListener("change", update); });
  text.addEventListener("input", update);
  update();
})();

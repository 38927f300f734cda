// stepscope HTML report: builds the sortable, filterable tables from the embedded JSON.
// Every string is inserted with textContent, never as markup.
(function () {
  "use strict";
  var MAX_ROWS = 500;
  var node = document.getElementById("stepscope-data");
  var data = node ? JSON.parse(node.textContent) : { tables: {} };

  function compare(a, b) {
    if (a === null || a === undefined) return 1;
    if (b === null || b === undefined) return -1;
    if (typeof a === "number" && typeof b === "number") return a - b;
    return String(a).localeCompare(String(b));
  }

  function formatCell(value, kind) {
    if (value === null || value === undefined) return "–";
    if (kind === "us") return value >= 1000 ? (value / 1000).toFixed(2) + " ms" : value.toFixed(1) + " µs";
    if (kind === "bytes") {
      var units = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0, v = Math.abs(value);
      while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
      return (value < 0 ? "-" : "") + v.toFixed(v >= 100 || i === 0 ? 0 : 1) + " " + units[i];
    }
    if (kind === "pct") return value.toFixed(1) + "%";
    if (kind === "ratio") return (100 * value).toFixed(1) + "%";
    if (kind === "bool") return value ? "yes" : "no";
    if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(3);
    return String(value);
  }

  function Table(holder, spec) {
    this.holder = holder;
    this.spec = spec;
    this.rows = spec.rows.slice();
    this.filter = "";
    this.sortColumn = spec.sort !== undefined ? spec.sort : -1;
    this.descending = true;
    this.build();
  }

  Table.prototype.build = function () {
    var self = this;
    var bar = document.createElement("div");
    bar.className = "table-bar";
    var input = document.createElement("input");
    input.type = "search";
    input.placeholder = "filter " + (this.spec.noun || "rows") + "…";
    input.addEventListener("input", function () { self.filter = input.value.toLowerCase(); self.render(); });
    bar.appendChild(input);
    this.count = document.createElement("span");
    this.count.className = "table-count";
    bar.appendChild(this.count);
    this.holder.appendChild(bar);
    var table = document.createElement("table");
    table.className = "data";
    var head = document.createElement("thead");
    var row = document.createElement("tr");
    this.headers = [];
    this.spec.columns.forEach(function (column, index) {
      var th = document.createElement("th");
      th.textContent = column.label;
      th.title = "sort by " + column.label;
      if (column.kind && column.kind !== "text") th.className = "num";
      th.addEventListener("click", function () { self.sortBy(index); });
      row.appendChild(th);
      self.headers.push(th);
    });
    head.appendChild(row);
    table.appendChild(head);
    this.body = document.createElement("tbody");
    table.appendChild(this.body);
    var scroll = document.createElement("div");
    scroll.className = "table-scroll";
    scroll.appendChild(table);
    this.holder.appendChild(scroll);
    this.render();
  };

  Table.prototype.sortBy = function (index, direction) {
    if (direction) this.descending = direction === "desc";
    else this.descending = this.sortColumn === index ? !this.descending : this.spec.columns[index].kind !== "text";
    this.sortColumn = index;
    var sign = this.descending ? -1 : 1;
    this.rows.sort(function (a, b) { return sign * compare(a[index], b[index]); });
    this.render();
  };

  Table.prototype.render = function () {
    var self = this;
    var shown = 0, matched = 0;
    while (this.body.firstChild) this.body.removeChild(this.body.firstChild);
    this.rows.forEach(function (values) {
      if (self.filter && String(values[0]).toLowerCase().indexOf(self.filter) < 0) return;
      matched += 1;
      if (shown >= MAX_ROWS) return;
      shown += 1;
      var tr = document.createElement("tr");
      values.forEach(function (value, index) {
        var td = document.createElement("td");
        var kind = self.spec.columns[index].kind;
        td.textContent = formatCell(value, kind);
        if (kind && kind !== "text") td.className = "num";
        else if (typeof value === "string" && value.length > 60) td.title = value;
        tr.appendChild(td);
      });
      self.body.appendChild(tr);
    });
    this.headers.forEach(function (th, index) {
      th.setAttribute("aria-sort", index === self.sortColumn ? (self.descending ? "descending" : "ascending") : "none");
    });
    this.count.textContent = shown + " of " + matched + (matched === this.rows.length ? "" : " matching") +
      (this.spec.total > this.rows.length ? " (" + this.spec.total + " in the trace; the largest kept)" : "");
  };

  var tables = {};
  Array.prototype.forEach.call(document.querySelectorAll("[data-table]"), function (holder) {
    var spec = data.tables[holder.getAttribute("data-table")];
    if (spec) tables[holder.getAttribute("data-table")] = new Table(holder, spec);
  });

  // "#sort=TABLE:COLUMN:asc|desc[&filter=TABLE:TEXT]" sorts (and filters) on load and when the hash
  // changes: links into the report and tests use it.
  function applyHash() {
    var hash;
    try {
      hash = decodeURIComponent(window.location.hash.replace(/^#/, ""));
    } catch (error) {
      return;  // a malformed hash is ignored, not an error
    }
    hash.split("&").forEach(function (part) {
      var pieces = part.split("=");
      var args = (pieces[1] || "").split(":");
      var table = tables[args[0]];
      if (!table) return;
      if (pieces[0] === "sort") {
        var column = table.spec.columns.findIndex(function (c) { return c.key === args[1]; });
        if (column >= 0) table.sortBy(column, args[2] || "desc");
      } else if (pieces[0] === "filter") {
        table.filter = args.slice(1).join(":").toLowerCase();
        table.render();
      }
    });
  }
  applyHash();
  window.addEventListener("hashchange", applyHash);
  document.documentElement.setAttribute("data-ready", "1");
})();

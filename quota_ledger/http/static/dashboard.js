// The dashboard's only script, inlined into /ui: plain JavaScript, no build step, no CDN.
// It formats quantities, draws the usage history as inline SVG and refreshes the page's data.
"use strict";
(function () {
  const REFRESH_SECONDS = Number(document.body.dataset.refreshSeconds) || 15;
  const BINARY = [["Pi", 2 ** 50], ["Ti", 2 ** 40], ["Gi", 2 ** 30], ["Mi", 2 ** 20], ["Ki", 2 ** 10]];
  const MILLI = new Set(["vcore", "cpu"]);

  function isBytes(resource) {
    return /(^|[./])(memory|storage|ephemeral-storage)$/.test(resource) || resource.startsWith("hugepages-");
  }
  function trim(number, digits) {
    return number.toFixed(digits).replace(/\.?0+$/, "");
  }
  // Base units as a person reads them: bytes with binary suffixes, cores from milli-cores.
  function fmt(resource, value) {
    if (value === null || value === undefined) return "-";
    const sign = value < 0 ? "\u2212" : "";
    const v = Math.abs(value);
    const short = resource.replace(/^(requests|limits)\./, "");
    if (MILLI.has(short)) {
      if (v === 0) return "0";
      if (v < 1000) return sign + v + "m";
      return sign + trim(v / 1000, v < 10000 ? 2 : 1);
    }
    if (isBytes(short)) {
      for (const [suffix, size] of BINARY) {
        if (v >= size) return sign + trim(v / size, v / size < 10 ? 2 : 1) + suffix;
      }
      return sign + v;
    }
    return sign + v.toLocaleString("en-US");
  }
  function formatAll(root) {
    root.querySelectorAll(".q[data-r][data-v]").forEach(function (el) {
      const value = Number(el.dataset.v);
      el.textContent = fmt(el.dataset.r, value);
      el.title = el.dataset.v + (MILLI.has(el.dataset.r) ? " milli-cores" : isBytes(el.dataset.r) ? " bytes" : "");
    });
  }
  function clock(date) {
    return date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hour12: false });
  }

  // -- usage over time -------------------------------------------------------------------
  const SVG = "http://www.w3.org/2000/svg";
  function node(name, attributes, parent) {
    const el = document.createElementNS(SVG, name);
    for (const key in attributes) el.setAttribute(key, attributes[key]);
    if (parent) parent.appendChild(el);
    return el;
  }
  function drawHistory() {
    const source = document.getElementById("history-data");
    const box = document.getElementById("history-chart");
    if (!source || !box) return;
    const data = JSON.parse(source.textContent);
    box.textContent = "";
    const resources = data.resources.filter(function (r) { return r !== "applications"; });
    if (!resources.length) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = "No usage or limits on this queue yet.";
      box.appendChild(p);
      return;
    }
    const width = Math.max(320, box.clientWidth || 600);
    resources.forEach(function (resource) { drawOne(box, data, resource, width); });
  }
  function drawOne(box, data, resource, width) {
    const points = data.points;
    const used = points.map(function (p) { return p.in_use[resource] || 0; });
    const held = points.map(function (p) { return p.reserved[resource] || 0; });
    const limit = data.limits[resource];
    const last = points.length - 1;
    const title = document.createElement("div");
    title.className = "chart-title";
    const now = used[last] + held[last];
    const share = limit ? " (" + Math.round((100 * now) / limit) + "%)" : "";
    title.innerHTML = "<b></b><span></span>";
    title.firstChild.textContent = resource;
    title.lastChild.textContent = "now " + fmt(resource, used[last]) + " in use, " + fmt(resource, held[last]) +
      " reserved" + (limit !== undefined ? " of " + fmt(resource, limit) + share : ", no limit");
    box.appendChild(title);
    const holder = document.createElement("div");
    holder.className = "chart-box";
    box.appendChild(holder);
    const height = 150, left = 54, right = 10, top = 8, bottom = 20;
    let peak = limit || 0;
    for (let i = 0; i <= last; i++) peak = Math.max(peak, used[i] + held[i]);
    peak = peak > 0 ? peak * 1.1 : 1;
    const x = function (i) { return left + ((width - left - right) * i) / Math.max(1, last); };
    const y = function (v) { return top + (height - top - bottom) * (1 - v / peak); };
    const svg = node("svg", { class: "chart", "data-resource": resource, viewBox: "0 0 " + width + " " + height,
      width: width, height: height, role: "img", "aria-label": resource + " in use and reserved over " + data.window }, holder);
    [0, 0.5, 1].forEach(function (f) {
      const v = (peak / 1.1) * f;
      node("line", { class: "grid", x1: left, x2: width - right, y1: y(v), y2: y(v) }, svg);
      node("text", { x: left - 6, y: y(v) + 3.5, "text-anchor": "end" }, svg).textContent = fmt(resource, Math.round(v));
    });
    let base = "M" + x(0) + "," + y(0);
    let top1 = "";
    let back = "";
    for (let i = 0; i <= last; i++) {
      base += " L" + x(i) + "," + y(used[i]);
      top1 += (i ? " L" : "M") + x(i) + "," + y(used[i] + held[i]);
      back = " L" + x(i) + "," + y(used[i]) + back;
    }
    node("path", { class: "area in-use", d: base + " L" + x(last) + "," + y(0) + " Z" }, svg);
    node("path", { class: "area reserved", d: top1 + back + " Z" }, svg);
    if (limit !== undefined) node("line", { class: "limit", x1: left, x2: width - right, y1: y(limit), y2: y(limit) }, svg);
    [0, Math.floor(last / 2), last].forEach(function (i, n) {
      const anchor = ["start", "middle", "end"][n];
      node("text", { x: x(i), y: height - 5, "text-anchor": anchor }, svg).textContent = clock(new Date(points[i].time));
    });
    const cursor = node("line", { class: "cursor", y1: top, y2: height - bottom, visibility: "hidden" }, svg);
    const tip = document.createElement("div");
    tip.className = "tip";
    holder.appendChild(tip);
    svg.addEventListener("mousemove", function (event) {
      const box2 = svg.getBoundingClientRect();
      const mx = ((event.clientX - box2.left) * width) / box2.width;
      const i = Math.max(0, Math.min(last, Math.round(((mx - left) / (width - left - right)) * last)));
      cursor.setAttribute("x1", x(i));
      cursor.setAttribute("x2", x(i));
      cursor.setAttribute("visibility", "visible");
      tip.textContent = clock(new Date(points[i].time)) + "  in use " + fmt(resource, used[i]) + ", reserved " + fmt(resource, held[i]);
      tip.style.display = "block";
      tip.style.left = Math.min(box2.width - tip.offsetWidth, Math.max(0, (x(i) * box2.width) / width + 8)) + "px";
      tip.style.top = "4px";
    });
    svg.addEventListener("mouseleave", function () {
      cursor.setAttribute("visibility", "hidden");
      tip.style.display = "none";
    });
  }

  // -- refresh ---------------------------------------------------------------------------
  let refreshedAt = null;
  let failedAt = null;
  function showRefreshed() {
    const state = document.getElementById("refresh-text");
    if (!state || !refreshedAt) return;
    const ago = Math.max(0, Math.round((Date.now() - refreshedAt.getTime()) / 1000));
    let text = "refreshed " + refreshedAt.toLocaleTimeString([], { hour12: false }) + " (" + ago + " s ago)";
    if (failedAt) text += ", refresh failed at " + failedAt.toLocaleTimeString([], { hour12: false });
    state.textContent = text;
    state.parentElement.classList.toggle("failed", failedAt !== null);
  }
  function readStamp() {
    const stamp = document.getElementById("generated");
    if (stamp) refreshedAt = new Date(stamp.getAttribute("datetime"));
  }
  function refresh() {
    fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        // The session ended (it expired, or its token was revoked): the page itself now is the
        // sign-in form.
        if (response.status === 401) window.location.reload();
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        const fresh = new DOMParser().parseFromString(html, "text/html");
        const content = fresh.getElementById("content");
        if (!content) throw new Error("no content");
        document.getElementById("content").replaceWith(content);
        document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
        failedAt = null;
        setUp();
      })
      .catch(function () {
        failedAt = new Date();
        showRefreshed();
      });
  }
  function setUp() {
    formatAll(document);
    drawHistory();
    readStamp();
    showRefreshed();
  }

  // A token in the address is never accepted (an old link may carry one): keep it out of the
  // address bar, the history and the page's own refreshes.
  const address = new URL(window.location.href);
  if (address.searchParams.has("token")) {
    address.searchParams.delete("token");
    window.history.replaceState(null, "", address.toString());
  }
  const auto = document.getElementById("auto-refresh");
  if (auto) {
    auto.checked = window.localStorage.getItem("quota-ledger-auto-refresh") !== "off";
    auto.addEventListener("change", function () {
      window.localStorage.setItem("quota-ledger-auto-refresh", auto.checked ? "on" : "off");
    });
  }
  const controls = document.getElementById("controls");
  if (controls) {
    controls.querySelectorAll("select").forEach(function (select) {
      select.addEventListener("change", function () {
        if (select.name === "partition") controls.elements.queue.value = "root";
        controls.submit();
      });
    });
  }
  setUp();
  window.setInterval(function () {
    if (!auto || auto.checked) refresh();
  }, REFRESH_SECONDS * 1000);
  window.setInterval(showRefreshed, 1000);
  let resizeTimer = null;
  window.addEventListener("resize", function () {
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(drawHistory, 150);
  });
})();

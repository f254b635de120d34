// The book's own scripts: readable search results, and print with everything unfolded.
"use strict";

// ---- TeX as plain text, for search excerpts and titles ----------------------------------
const BOOK_TEX_SYMBOLS = {
  alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ε", varepsilon: "ε",
  zeta: "ζ", eta: "η", theta: "θ", lambda: "λ", mu: "μ", nu: "ν", pi: "π", rho: "ρ",
  sigma: "σ", tau: "τ", phi: "φ", varphi: "φ", chi: "χ", psi: "ψ", omega: "ω",
  Gamma: "Γ", Delta: "Δ", Theta: "Θ", Lambda: "Λ", Pi: "Π", Sigma: "Σ", Phi: "Φ",
  Omega: "Ω", times: "×", cdot: "·", cdots: "⋯", ldots: "…", dots: "…", le: "≤",
  leq: "≤", ge: "≥", geq: "≥", ne: "≠", neq: "≠", approx: "≈", sim: "∼", propto: "∝",
  infty: "∞", sum: "Σ", prod: "Π", int: "∫", partial: "∂", nabla: "∇", in: "∈",
  to: "→", rightarrow: "→", leftarrow: "←", mapsto: "↦", pm: "±", mp: "∓",
  sqrt: "√", top: "ᵀ", langle: "⟨", rangle: "⟩", lVert: "‖", rVert: "‖", Vert: "‖",
  mid: "|", odot: "⊙", otimes: "⊗", circ: "∘", ell: "ℓ", log: "log", exp: "exp",
  cos: "cos", sin: "sin", max: "max", min: "min", arg: "arg",
};

function bookTexToText(tex) {
  let s = String(tex);
  s = s.replace(/^\s*(\\\(|\\\[|\$\$?)/, "").replace(/(\\\)|\\\]|\$\$?)\s*$/, "");
  s = s.replace(/\\begin\{[a-z*]+\}|\\end\{[a-z*]+\}/g, " ");
  s = s.replace(/\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}/g, "($1)/($2)");
  s = s.replace(/\\(?:mathrm|mathbf|mathit|mathsf|mathcal|operatorname|text|textrm|boldsymbol|overline|bar|hat|tilde|vec)\s*\{([^{}]*)\}/g, "$1");
  s = s.replace(/\\(?:left|right|big|Big|bigg|Bigg|displaystyle|nonumber|label\{[^}]*\})/g, "");
  s = s.replace(/\\[,;:! ]|\\q?quad|~/g, " ");
  s = s.replace(/\\\\/g, "; ");
  s = s.replace(/\\([A-Za-z]+)/g, (m, name) => BOOK_TEX_SYMBOLS[name] ?? name);
  s = s.replace(/\\([{}_^&%#|])/g, "$1").replace(/[{}]/g, "").replace(/&/g, " ");
  return s.replace(/\s+/g, " ").trim();
}

function bookInstallSearchFixes() {
  if (typeof Search === "undefined" || Search.__bookFixed) return;
  Search.__bookFixed = true;
  // Excerpts: the article's text only (not the header's buttons, "Repository" among them),
  // with each formula as readable text instead of raw TeX.
  Search.htmlToText = (htmlString, anchor) => {
    const doc = new DOMParser().parseFromString(htmlString, "text/html");
    const chrome = [
      ".headerlink", "script", "style", ".bd-header-article", ".header-article",
      ".prev-next-area", ".bd-footer-article", "button", ".dropdown-menu",
      "details.above-input", ".cell_input", "nav",
      ".d-none", // a citation's twin text for JupyterLab (scripts/jupyterlab_citations.py)
    ];
    for (const query of chrome) doc.querySelectorAll(query).forEach((el) => el.remove());
    doc.querySelectorAll(".math").forEach((el) => {
      el.replaceWith(doc.createTextNode(" " + bookTexToText(el.textContent) + " "));
    });
    const main = doc.querySelector("article") || doc.querySelector('[role="main"]');
    if (!main) return "";
    const scope = (anchor && main.querySelector(anchor)) || main;
    return scope.textContent.replace(/\s+/g, " ");
  };
  // Titles: "the L \times S matrix" reads "the L × S matrix".
  const cleanIndex = (index) => {
    if (!index) return index;
    if (Array.isArray(index.titles)) index.titles = index.titles.map(bookTexToText);
    if (index.alltitles) {
      const fixed = {};
      for (const [k, v] of Object.entries(index.alltitles)) fixed[bookTexToText(k)] = v;
      index.alltitles = fixed;
    }
    return index;
  };
  const original = Search.setIndex;
  Search.setIndex = (index) => original.call(Search, cleanIndex(index));
  if (Search._index) cleanIndex(Search._index);
}

bookInstallSearchFixes();
document.addEventListener("DOMContentLoaded", bookInstallSearchFixes);

// ---- Narrow screens: an inline formula wider than its line scrolls in its own box ----------
function bookMarkWideMath() {
  document.querySelectorAll('mjx-container:not([display="true"])').forEach((el) => {
    el.classList.remove("book-wide-math");
    const line = el.closest("p, li, dd, td, div") || el.parentElement;
    if (el.getBoundingClientRect().width > line.clientWidth) el.classList.add("book-wide-math");
  });
}
function bookWatchMath() {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    MathJax.startup.promise.then(bookMarkWideMath);
  }
  window.addEventListener("resize", bookMarkWideMath);
}
if (document.readyState === "loading") {
  document.addEventListener("DOMContentLoaded", bookWatchMath);
} else {
  bookWatchMath();
}

// ---- Print: everything folded opens --------------------------------------------------------
function bookUnfoldForPrint() {
  document.querySelectorAll("details").forEach((d) => { d.open = true; });
  document.querySelectorAll(".toggle-hidden").forEach((el) => el.classList.remove("toggle-hidden"));
}
window.addEventListener("beforeprint", bookUnfoldForPrint);
window.bookUnfoldForPrint = bookUnfoldForPrint;

// ---- Figures: a tap opens the full-size SVG -------------------------------------------------
function bookLinkFigures() {
  document.querySelectorAll("article .cell_output img, article figure img").forEach((img) => {
    if (img.closest("a")) return;
    const link = document.createElement("a");
    link.href = img.getAttribute("src");
    link.className = "book-figure-link";
    link.title = "Open the figure at full size";
    img.replaceWith(link);
    link.appendChild(img);
  });
}

// ---- Solutions: the whole title opens the solution ------------------------------------------
// sphinx-exercise links "Exercise 2.1" in a solution's title back to the exercise, which sits
// right above it; on a dropdown that link stole the tap meant to open the solution. The
// link's target stays in data-book-href: the PDF (scripts/build_pdf.py), where solutions
// move to the chapter's end, makes it a link again and links the exercise to its solution.
function bookSolutionTitles() {
  document.querySelectorAll(".solution.dropdown > .admonition-title a.reference").forEach((a) => {
    const span = document.createElement("span");
    span.className = "book-solution-exercise";
    span.dataset.bookHref = a.getAttribute("href") || "";
    while (a.firstChild) span.appendChild(a.firstChild);
    a.replaceWith(span);
  });
}

function bookPageReady() {
  bookLinkFigures();
  bookSolutionTitles();
}
if (document.readyState === "loading") {
  document.addEventListener("DOMContentLoaded", bookPageReady);
} else {
  bookPageReady();
}

// ---- Phones: inline code breaks only between the parts of a name --------------------------
// `checks.check_receptive_field(receptive_field)` may break before a ".", after a "_", "(", ","
// or "/" (a path), never inside a word nor after a hyphen (book.css: overflow-wrap: normal).
// Code in a table keeps one line.
function bookCodeBreaks() {
  document.querySelectorAll("article code.literal").forEach((code) => {
    if (code.dataset.bookBreaks || code.closest("table, dt.sig")) return;
    code.dataset.bookBreaks = "1";
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    const texts = [];
    for (let n = walker.nextNode(); n; n = walker.nextNode()) texts.push(n);
    for (const node of texts) {
      // each piece between two allowed breaks keeps one line (a browser would also break
      // after a hyphen: "--device", "1e-9", "->"); spaces still break
      const frag = document.createDocumentFragment();
      for (const word of node.textContent.split(/(\s+)/)) {
        if (!word) continue;
        if (/^\s+$/.test(word)) {
          frag.appendChild(document.createTextNode(word));
          continue;
        }
        word.split(/(?<=[_(,/])(?=[\w<*])|(?<=\w)(?=\.\w)/).forEach((part, i) => {
          if (i) frag.appendChild(document.createElement("wbr"));
          const piece = document.createElement("span");
          piece.className = "book-nobreak";
          piece.textContent = part;
          frag.appendChild(piece);
        });
      }
      node.replaceWith(frag);
    }
  });
}

// ---- Phones: a number in a table stays whole; a table wider than the screen says so ------
const BOOK_NUMBER = /[−-]?\d+(?:[.,]\d+)*(?:e[−+-]?\d+)?%?(?:\s*±\s*\d+(?:[.,]\d+)*(?:e[−+-]?\d+)?%?)?(?:\s*\(\d+(?:[.,]\d+)*\s*[–−-]\s*\d+(?:[.,]\d+)*\))?/g;
function bookTableNumbers() {
  document.querySelectorAll("article table:not(.indextable) :is(td, th)").forEach((cell) => {
    if (cell.dataset.bookNumbers) return;
    cell.dataset.bookNumbers = "1";
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT, {
      acceptNode: (n) => (n.parentElement.closest("mjx-container, code") ? 2 : 1),
    });
    const texts = [];
    for (let n = walker.nextNode(); n; n = walker.nextNode()) texts.push(n);
    for (const node of texts) {
      const text = node.textContent;
      const found = [...text.matchAll(BOOK_NUMBER)].filter((m) => /[\s–−+-]/.test(m[0].slice(1)));
      if (!found.length) continue;
      const frag = document.createDocumentFragment();
      let at = 0;
      for (const m of found) {
        frag.appendChild(document.createTextNode(text.slice(at, m.index)));
        const span = document.createElement("span");
        span.className = "book-number";
        span.textContent = m[0];
        frag.appendChild(span);
        at = m.index + m[0].length;
      }
      frag.appendChild(document.createTextNode(text.slice(at)));
      node.replaceWith(frag);
    }
  });
}

// A box that scrolls sideways on purpose (a wide table, a formula that still does not fit)
// gets a visible label above it.
function bookLabelScrolling(box, what) {
  const next = box.previousElementSibling;
  const has = next && next.classList.contains("book-scroll-hint");
  const wide = box.scrollWidth > box.clientWidth + 1;
  if (wide && !has) {
    const hint = document.createElement("div");
    hint.className = "book-scroll-hint";
    hint.textContent = `This ${what} is wider than the screen: swipe it sideways \u2192`;
    box.before(hint);
  } else if (!wide && has) {
    next.remove();
  }
}
function bookLabelTables() {
  document.querySelectorAll("article table:not(.indextable)").forEach((t) => {
    bookLabelScrolling(t, "table");
  });
}

// ---- Phones: a display formula wider than the screen breaks at its relations -------------
// MathJax 3 does not break lines. A formula that does not fit is typeset again, for this
// screen only, with a line per statement (at \qquad) and per relation (=, \le, \approx ...),
// aligned at the relation; then, if still too wide, with a line per top-level + or -. What
// still does not fit is shown at up to 20% smaller, and then scrolls in its box, labelled.
const BOOK_RELATIONS = ["=", "<", ">", "\\le", "\\leq", "\\ge", "\\geq", "\\approx", "\\equiv", "\\ne", "\\neq", "\\sim"];
const BOOK_OPEN = ["left", "begin", "lVert", "lvert", "langle", "lfloor", "lceil"];
const BOOK_CLOSE = ["right", "end", "rVert", "rvert", "rangle", "rfloor", "rceil"];
function bookSplitTeX(tex) {
  let body = tex.trim();
  const split = body.match(/^\\begin\{split\}([\s\S]*)\\end\{split\}$/);
  if (split) body = split[1].trim();
  const cuts = [];
  let depth = 0;
  for (let i = 0; i < body.length; i++) {
    const c = body[i];
    if (c === "\\") {
      const word = body.slice(i + 1).match(/^[A-Za-z]+|^./)[0];
      if (BOOK_OPEN.includes(word)) depth += 1;
      else if (BOOK_CLOSE.includes(word)) depth -= 1;
      else if (depth === 0 && word === "qquad") cuts.push({ at: i, end: i + 7, kind: "stmt" });
      else if (depth === 0 && BOOK_RELATIONS.includes("\\" + word)) cuts.push({ at: i, kind: "rel" });
      else if (word === "\\" && depth === 0) return null;  // already broken by the author
      i += word.length;
      continue;
    }
    if (c === "{" || c === "(" || c === "[") depth += 1;
    else if (c === "}" || c === ")" || c === "]") depth -= 1;
    else if (c === "&" ) return null;
    if (depth < 0) return null;
    if (depth !== 0) continue;
    if (c === "=" || c === "<" || c === ">") cuts.push({ at: i, kind: "rel" });
    else if ((c === "+" || c === "-") && !/[=(,{\[&]$|^$/.test(body.slice(0, i).trimEnd().slice(-1))) {
      const before = body.slice(0, i).trimEnd();
      if (!BOOK_RELATIONS.some((r) => before.endsWith(r))) cuts.push({ at: i, kind: "op" });
    }
  }
  if (depth !== 0) return null;
  // level 0: a line per statement; 1: and per relation; 2: and per top-level + or -.
  // Lines of a statement are left-aligned, each continuation indented by a \quad.
  const build = (level) => {
    const statements = [[]];
    let at = 0;
    for (const cut of cuts) {
      if ((cut.kind === "rel" && level < 1) || (cut.kind === "op" && level < 2)) continue;
      const rows = statements[statements.length - 1];
      rows.push(body.slice(at, cut.at));
      if (cut.kind === "stmt") statements.push([]);
      at = cut.kind === "stmt" ? cut.end : cut.at;
    }
    statements[statements.length - 1].push(body.slice(at));
    const parts = statements
      .map((rows) => rows.map((r) => r.trim()).filter((r) => r))
      .filter((rows) => rows.length)
      .map((rows) => (rows.length === 1 ? rows[0]
        : "\\begin{aligned}&" + rows.join("\\\\&\\quad ") + "\\end{aligned}"));
    if (parts.length === 1) return parts[0];
    return "\\begin{gathered}" + parts.join("\\\\") + "\\end{gathered}";
  };
  const kinds = new Set(cuts.map((c) => c.kind));
  const tries = [];
  if (kinds.has("stmt")) tries.push(build(0));
  if (kinds.has("rel")) tries.push(build(1));
  if (kinds.has("op")) tries.push(build(2));
  return tries.filter((t, k) => t && t !== body && tries.indexOf(t) === k);
}

const bookFitted = [];
async function bookFitDisplayMath() {
  if (!(window.MathJax && MathJax.startup && MathJax.typesetPromise)) {
    document.documentElement.dataset.bookMathFitted = "1";  // a page without formulas
    return;
  }
  await MathJax.startup.promise;
  // back to the formulas as written (a turned phone, a wider window)
  while (bookFitted.length) {
    const { shown, original } = bookFitted.pop();
    shown.replaceWith(original);
  }
  document.querySelectorAll(".book-math-hint").forEach((h) => h.remove());
  document.querySelectorAll(".book-math-scrolls").forEach((b) => b.classList.remove("book-math-scrolls"));
  const narrow = document.documentElement.clientWidth < 720;
  const items = Array.from(MathJax.startup.document.math).filter(
    (m) => m.display && m.typesetRoot && m.typesetRoot.isConnected,
  );
  for (const item of items) {
    const root = item.typesetRoot;
    root.style.fontSize = "";
    const box = root.closest("div.math") || root.parentElement;
    const room = box.clientWidth;
    let shown = root;
    if (!narrow || root.firstElementChild.getBoundingClientRect().width <= room) continue;
    for (const tex of bookSplitTeX(item.math) || []) {
      const holder = document.createElement("span");
      holder.className = "book-math-broken";
      holder.textContent = "\\[" + tex + "\\]";
      shown.replaceWith(holder);
      if (shown === root) bookFitted.push({ shown: holder, original: root });
      else bookFitted[bookFitted.length - 1].shown = holder;
      await MathJax.typesetPromise([holder]);
      shown = holder;
      const c = holder.querySelector("mjx-container");
      if (c && !holder.querySelector("mjx-merror") && c.firstElementChild.getBoundingClientRect().width <= room) break;
    }
    const container = shown.matches("mjx-container") ? shown : shown.querySelector("mjx-container");
    const w = container.firstElementChild.getBoundingClientRect().width;
    if (w > room) container.style.fontSize = `${Math.max(0.8, room / w) * 100}%`;
  }
  document.querySelectorAll('article mjx-container[display="true"]').forEach((c) => {
    const box = c.closest("div.math") || c;
    if (box.scrollWidth > box.clientWidth + 1 || c.scrollWidth > c.clientWidth + 1) {
      box.classList.add("book-math-scrolls");
      const hint = document.createElement("div");
      hint.className = "book-scroll-hint book-math-hint";
      hint.textContent = "This formula is wider than the screen: swipe it sideways \u2192";
      box.before(hint);
    }
  });
  document.documentElement.dataset.bookMathFitted = "1";
}

let bookResizeTimer = null;
function bookPhoneLayout() {
  bookCodeBreaks();
  bookTableNumbers();
  bookLabelTables();
  bookFitDisplayMath();
}
window.addEventListener("resize", () => {
  clearTimeout(bookResizeTimer);
  bookResizeTimer = setTimeout(() => { bookLabelTables(); bookFitDisplayMath(); }, 250);
});
if (document.readyState === "loading") {
  document.addEventListener("DOMContentLoaded", bookPhoneLayout);
} else {
  bookPhoneLayout();
}

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

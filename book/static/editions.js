/*
 * The two editions of the book, in the browser (no network, no library).
 *
 * 1. Navigation: every link of the sidebar, the page's contents and previous/next gets the
 *    lang and dir of the page it leads to, so Persian titles with Latin words in them
 *    ("درس ۷۸: مرحلهٔ ۱ ZeRO") read right-to-left even on English pages, and English ones
 *    left-to-right on Persian pages.
 * 2. Search: every search form sends the page's edition; the search page then keeps only that
 *    edition's pages (and the bilingual home page) and speaks Persian for a Persian search.
 *
 * 3. Latin inside Persian: each run of Latin words in a right-to-left text (the article, the
 *    navigation, search results) is wrapped in an isolating <bdi dir="ltr">, so that a list joined
 *    by the Persian comma keeps its order ("DDP، ZeRO-1", not "ZeRO-1 ،DDP"), and a hyphenated
 *    word ("all-gather") is never broken at its hyphen onto the wrong side of the line.
 * 4. The sidebar buttons: sphinx-book-theme puts a second ☰ and a second contents button above
 *    the article, but both themes' scripts listen only to the first (hidden) copy of each
 *    (pydata-sphinx-theme issue #2451): a click on a visible copy is passed on to it.
 * 5. Search folds Arabic yeh, alef maksura and kaf to the Persian letters (the index holds only
 *    Persian ones), previews start at the page's own text (not the run box), and results read
 *    in their page's direction with Latin runs (file names) isolated.
 *
 * A page's edition comes from the language switch that book/_templates/layout.html puts on it
 * (<nav class="edition-switch" lang="fa|en">); the home and search pages have none.
 */
(() => {
  "use strict";
  const FOLDERS = { fa: ["fa/", "notebooks/fa/"], en: ["en/", "notebooks/en/"] };
  const DIRECTION = { fa: "rtl", en: "ltr" };

  /* "fa", "en" or null for a docname ("notebooks/fa/78-zero") or a URL path. */
  const editionOf = (path) => {
    for (const [edition, folders] of Object.entries(FOLDERS)) {
      if (folders.some((folder) => path.startsWith(folder) || path.includes("/" + folder))) {
        return edition;
      }
    }
    return null;
  };

  const pageEdition = () => {
    const nav = document.querySelector("nav.edition-switch");
    return nav ? nav.getAttribute("lang") : null;
  };

  const markLink = (link, edition) => {
    const item = link.closest("li") || link;
    for (const element of new Set([item, link])) {
      element.setAttribute("lang", edition);
      element.setAttribute("dir", DIRECTION[edition]);
      element.classList.add("edition-" + edition);
    }
  };

  const markNavigation = () => {
    const links = document.querySelectorAll(
      ".bd-sidebar-primary nav a, .bd-sidebar-secondary nav a, .prev-next-area a");
    for (const link of links) {
      const edition = editionOf(new URL(link.href, document.baseURI).pathname);
      if (edition) markLink(link, edition);
    }
    for (const caption of document.querySelectorAll(".bd-sidebar-primary p.caption")) {
      const list = caption.nextElementSibling;
      const first = list && list.querySelector("a");
      const edition = first && editionOf(new URL(first.href, document.baseURI).pathname);
      if (edition) {
        caption.setAttribute("lang", edition);
        caption.setAttribute("dir", DIRECTION[edition]);
      }
    }
  };

  const sendEditionWithSearch = (edition) => {
    for (const form of document.querySelectorAll("form.bd-search, form[action$='search.html']")) {
      if (form.querySelector("input[name='edition']")) continue;
      const input = document.createElement("input");
      input.type = "hidden";
      input.name = "edition";
      input.value = edition;
      form.appendChild(input);
    }
  };

  /* On search.html: keep the asked edition's pages, in that edition's language. */
  const filterSearch = (edition) => {
    if (typeof Search === "undefined" || !FOLDERS[edition]) return;
    const search = Search;  // eslint-disable-line no-undef
    const perform = search._performSearch;
    search._performSearch = (...args) =>
      perform(...args).filter(([docname]) => [edition, null].includes(editionOf(docname)));
    if (edition !== "fa") return;
    const messages = document.getElementById("edition-messages");
    if (messages && typeof Documentation !== "undefined") {
      Documentation.addTranslations({  // eslint-disable-line no-undef
        locale: "fa", plural_expr: "n > 1", messages: JSON.parse(messages.textContent) });
    }
    // The result count in Persian digits, whenever searchtools.js writes the summary.
    const toPersian = (text) => text.replace(/\d/g, (d) => "۰۱۲۳۴۵۶۷۸۹"[d]);
    new MutationObserver(() => {
      const summary = document.querySelector("#search-results p.search-summary");
      if (summary && /\d/.test(summary.textContent)) summary.textContent = toPersian(summary.textContent);
    }).observe(document.body, { childList: true, subtree: true, characterData: true });
    document.documentElement.lang = "fa";
    document.documentElement.dir = "rtl";
    document.body.classList.add("lang-fa");
    const heading = document.querySelector(".bd-search-container h1, article h1");
    if (heading && messages) heading.textContent = JSON.parse(messages.textContent).Search;
  };


  /* --- 3. Latin runs inside right-to-left text --------------------------------------------- */
  // A Latin word: letters, digits and _, joined inside by - . / : + ' (ZeRO-1, torch.distributed,
  // 1F1B). A run: such words (and numbers between them) separated by spaces or by , + & / = :
  // with spaces, the way an English phrase is written. A Persian letter or comma ends a run.
  const WORD = "[A-Za-z0-9_]*[A-Za-z][A-Za-z0-9_]*(?:[-./:+'\u2019][A-Za-z0-9_]+)*";
  const NUMBER = "[0-9]+(?:[.,][0-9]+)*";
  const SEPARATOR = "(?:[ \u00a0]*[,+&/=\u00d7:][ \u00a0]*|[ \u00a0]+)";
  const LATIN_RUN = new RegExp(
    `(?:${NUMBER}${SEPARATOR})*${WORD}(?:${SEPARATOR}(?:${WORD}|${NUMBER}(?![.,]?[0-9])))*`, "g");
  const HYPHENATED = /[A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+)+/g;
  // Never touched: code and math (MathJax reads .math), text already isolated, the explorers and
  // the calculator (their scripts rewrite their own text), the bilingual site title.
  const LEAVE_ALONE = "script, style, code, pre, kbd, samp, textarea, svg, .math, mjx-container, "
    + "bdi, .explorer, .memory-calculator, .navbar-brand, .cell_output";

  const isolateRun = (text) => {
    const bdi = document.createElement("bdi");
    bdi.dir = "ltr";
    bdi.className = "latin-run";
    let last = 0;
    for (const match of text.matchAll(HYPHENATED)) {
      bdi.append(text.slice(last, match.index));
      const word = document.createElement("span");
      word.className = "latin-run__word";  // rtl.css: no line break inside it
      word.textContent = match[0];
      bdi.append(word);
      last = match.index + match[0].length;
    }
    bdi.append(text.slice(last));
    return bdi;
  };

  const isolateLatin = (root) => {
    if (!root) return;
    const direction = new Map();
    const rightToLeft = (element) => {
      if (!direction.has(element)) direction.set(element, getComputedStyle(element).direction);
      return direction.get(element) === "rtl";
    };
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
      acceptNode: (node) => (/[A-Za-z]/.test(node.data) && node.parentElement
        && !node.parentElement.closest(LEAVE_ALONE) && rightToLeft(node.parentElement)
        ? NodeFilter.FILTER_ACCEPT : NodeFilter.FILTER_REJECT),
    });
    const nodes = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) nodes.push(node);
    for (const node of nodes) {
      const parts = [];
      let last = 0;
      for (const match of node.data.matchAll(LATIN_RUN)) {
        parts.push(node.data.slice(last, match.index), isolateRun(match[0]));
        last = match.index + match[0].length;
      }
      if (!parts.length) continue;
      parts.push(node.data.slice(last));
      node.replaceWith(...parts.filter((part) => part !== ""));
    }
  };

  /* --- 4. The sidebar buttons -------------------------------------------------------------- */
  const forwardSidebarButtons = () => {
    for (const kind of ["primary", "secondary"]) {
      const [listened, ...copies] = document.querySelectorAll(`button.${kind}-toggle`);
      for (const copy of copies) {
        copy.addEventListener("click", (event) => {
          event.preventDefault();
          event.stopPropagation();
          const tooltip = window.bootstrap && bootstrap.Tooltip.getInstance(copy);  // eslint-disable-line no-undef
          if (tooltip) tooltip.hide();
          listened.click();
        });
      }
    }
  };

  /* --- 5. Search ----------------------------------------------------------------------------- */
  const ARABIC_TO_PERSIAN = { "\u064a": "\u06cc", "\u0649": "\u06cc", "\u0643": "\u06a9" };
  const foldArabic = (text) => text.replace(/[\u064a\u0649\u0643]/g, (c) => ARABIC_TO_PERSIAN[c]);

  const improveSearch = () => {
    if (typeof Search === "undefined") return;
    const search = Search;  // eslint-disable-line no-undef
    const parse = search._parseQuery;
    search._parseQuery = (query) => parse(foldArabic(query));
    // The preview: the article's own prose (no run box, language switch, page contents,
    // previous/next, code cells, their outputs or the explorers), its white space collapsed.
    search.htmlToText = (html, anchor) => {
      const page = new DOMParser().parseFromString(html, "text/html");
      page.querySelectorAll(".headerlink, script, style, .run-lesson, .edition-switch, "
        + ".cell_input, .cell_output, .explorer, .memory-calculator")
        .forEach((element) => element.remove());
      const article = page.querySelector("article.bd-article") || page.querySelector("[role=main]");
      if (!article) return "";
      const part = anchor && page.getElementById(decodeURIComponent(anchor.replace(/^#/, "")));
      return (part || article).textContent.replace(/\s+/g, " ").trim();
    };
    const results = document.getElementById("search-results");
    if (!results) return;
    const markResults = () => {
      for (const item of results.querySelectorAll("ul.search > li")) {
        const link = item.querySelector("a");
        const edition = link && editionOf(new URL(link.href, document.baseURI).pathname);
        if (edition && !item.hasAttribute("lang")) markLink(link, edition);
        if (edition && item.lang === edition) item.setAttribute("dir", DIRECTION[edition]);
      }
      isolateLatin(results);
    };
    new MutationObserver(markResults).observe(results, { childList: true, subtree: true });
  };

  const edition = pageEdition();
  improveSearch();
  const asked = new URLSearchParams(window.location.search).get("edition");
  if (asked && FOLDERS[asked]) {
    filterSearch(asked);
    sendEditionWithSearch(asked);
  }
  const start = () => {
    markNavigation();
    forwardSidebarButtons();
    for (const root of document.querySelectorAll(".bd-sidebar-primary nav, .bd-main")) {
      isolateLatin(root);
    }
    if (edition) sendEditionWithSearch(edition);
    if (asked && FOLDERS[asked]) sendEditionWithSearch(asked);
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

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

  const edition = pageEdition();
  const asked = new URLSearchParams(window.location.search).get("edition");
  if (asked && FOLDERS[asked]) {
    filterSearch(asked);
    sendEditionWithSearch(asked);
  }
  const start = () => {
    markNavigation();
    if (edition) sendEditionWithSearch(edition);
    if (asked && FOLDERS[asked]) sendEditionWithSearch(asked);
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

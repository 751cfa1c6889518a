/*
 * What every lesson's explorer shares: the page's language, numbers in its digits, SVG
 * elements, labelled controls, and where an explorer goes on the page. No network, no library.
 *
 * An explorer script calls CourseExplorers.mount(name, build): once the page is loaded, build(host,
 * lang) fills each <div class="explorer" data-explorer="name"> of the page (a markdown cell of the
 * lesson holds one; in Jupyter it stays an empty div, and the cell above draws the same thing as a
 * static figure). Under node (the tests) there is no document: only the pure functions load.
 */
(() => {
  "use strict";
  const PERSIAN = "۰۱۲۳۴۵۶۷۸۹";
  const SVG = "http://www.w3.org/2000/svg";

  /* `text` with Western digits and the decimal point written the Persian way (as plots.number). */
  const digits = (text, lang) => (lang === "fa"
    ? String(text).replace(/\d/g, (d) => PERSIAN[d]).replace(/\./g, "٫") : String(text));

  /* Up to `places` decimals, trailing zeros dropped, in the language's digits. */
  const format = (value, lang, places = 2) => digits(String(Number(value.toFixed(places))), lang);

  /* A number typed with Persian or Western digits, and either decimal mark. */
  const parse = (text) => Number(String(text).trim()
    .replace(/[۰-۹]/g, (d) => PERSIAN.indexOf(d)).replace(/[٫,]/g, "."));

  const element = (tag, attributes = {}, ...children) => {
    const made = Object.assign(document.createElement(tag), attributes);
    made.append(...children);
    return made;
  };

  const svgElement = (tag, attributes = {}, text = null) => {
    const made = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes)) made.setAttribute(name, value);
    if (text !== null) made.textContent = text;
    return made;
  };

  /* A labelled control: the label's text, then the control (native, so the keyboard works). */
  const labelled = (text, control) => element("label", { className: "explorer__field" }, text, " ", control);

  /* A range slider with its value shown beside it in the page's digits. */
  const slider = (name, min, max, value, lang) => {
    const input = element("input", { type: "range", name, min, max, value, step: 1 });
    const shown = element("output", { className: "explorer__value" }, digits(value, lang));
    input.addEventListener("input", () => { shown.textContent = digits(input.value, lang); });
    return { input, shown, wrap: (text) => labelled(text, element("span", {}, input, " ", shown)) };
  };

  const select = (name, options, chosen) => {
    const made = element("select", { name });
    for (const [value, text] of options) made.add(new Option(text, value, false, value === chosen));
    return made;
  };

  /* `template` with each {key} replaced by values[key]: nodes for element.append. A value whose
     key is in `formulas` goes inside a left-to-right <bdi>, so that "(r − s − 1) mod N" keeps
     its order inside a Persian sentence. */
  const sentence = (template, values, formulas = []) => template.split(/(\{\w+\})/).map((part) => {
    const key = part.slice(1, -1);
    if (!(part.startsWith("{") && key in values)) return part;
    return formulas.includes(key) ? element("bdi", { dir: "ltr" }, values[key]) : values[key];
  });

  /* A term and its value for a <dl class="explorer__facts">: [dt, dd]; the dd's data-value
     names it for the browser test. `term` is text or a list of nodes (see `sentence`); a value
     given as text (a number and its unit) is never broken across lines (editions.css). */
  const fact = (term, value, key) => {
    const shown = element("dd", {}, ...(Array.isArray(value) ? value : [value]));
    shown.dataset.value = key;
    if (!Array.isArray(value)) shown.classList.add("explorer__number");  // "14 ms": one line
    return [element("dt", {}, ...(Array.isArray(term) ? term : [term])), shown];
  };

  /* Two buttons that move a `slider` one step down or up (within its bounds), then `update`. */
  const stepButtons = (range, labels, update) => [[labels.previous, -1], [labels.next, 1]].map(([text, by]) => {
    const button = element("button", { type: "button", className: "explorer__button" }, text);
    button.addEventListener("click", () => {
      range.input.value = Math.min(Number(range.input.max), Math.max(Number(range.input.min), Number(range.input.value) + by));
      update();
    });
    return button;
  });

  /* The note under an explorer: `template` with {date} in the page's digits, then the machine
     its constants were measured on, in the page's words: the English line kept left to right, the
     Persian one with its names already isolated (lesson_code.bench.stored.persian_machine). */
  const measuredNote = (template, measured, lang) => element("p", { className: "explorer__note" },
    template.replace("{date}", digits(measured.date, lang)),
    lang === "fa" ? element("span", {}, measured.machine.fa) : element("bdi", { dir: "ltr" }, measured.machine.en));

  /* The width, in CSS pixels, to draw a chart in `figure` at (its text then keeps its size on a
     phone instead of shrinking with a wide drawing): the column's width, 300 to 720. */
  const chartWidth = (figure) => Math.max(300, Math.min(720, figure.clientWidth || 720));

  /* `text` with each Latin run (a name, a file name with its leading dot, a unit, a formula in
     Latin letters, and the spaces and signs inside it) in a left-to-right isolate, U+2066 ...
     U+2069: a Persian sentence keeps the run's order on the page, and when it is copied. A
     bracket that opens or closes outside the run stays outside; a run already isolated is left;
     text without Persian letters ("۱۴ ms", a file name) is left as it is. */
  const count = (text, character) => text.split(character).length - 1;
  const isolateRuns = (text) => !/[\u0621-\u064a\u067e-\u06d3]/.test(text) ? text : text.replace(/[^\u0600-\u06ff\u200c\u200f\u2066-\u2069]+/g, (run, at, whole) => {
    if (!/[A-Za-z]/.test(run) || whole[at - 1] === "\u2066") return run;
    let [, before, core, after] = run.match(/^([\s«»:;!?,]*)([\s\S]*?)([\s«»:;!?,.]*)$/);
    while (core.startsWith("(") && count(core, "(") > count(core, ")")) {
      before += "(";
      core = core.slice(1);
    }
    while (core.endsWith(")") && count(core, ")") > count(core, "(")) {
      after = ")" + after;
      core = core.slice(0, -1);
    }
    const open = core.match(/[\s(]*$/)[0], close = core.match(/^[\s)]*/)[0];  // "ZeRO-1 (" + Persian
    if (count(open, "(")) [core, after] = [core.slice(0, -open.length), open + after];
    if (count(close, ")")) [before, core] = [before + close, core.slice(close.length)];
    const [, inner, trimmed, outer] = core.match(/^(\s*)([\s\S]*?)(\s*)$/);
    return trimmed ? `${before}${inner}\u2066${trimmed}\u2069${outer}${after}` : run;
  });

  /* Every text of `root` (HTML and SVG) through isolateRuns, except what is already left to
     right: <bdi>, <pre>, <code>, and elements marked dir="ltr". */
  const isolateLatin = (root) => {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, { acceptNode: (node) =>
      (node.parentElement && node.parentElement.closest("bdi, pre, code, [dir=ltr]")
        ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT) });
    const nodes = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) nodes.push(node);
    for (const node of nodes) {
      const shown = isolateRuns(node.data);
      if (shown !== node.data) node.data = shown;
    }
  };

  const mount = (name, build) => {
    if (typeof document === "undefined") return;
    const run = () => {
      const lang = document.body.classList.contains("lang-fa") ? "fa" : "en";
      for (const host of document.querySelectorAll(`div.explorer[data-explorer="${name}"]`)) {
        host.lang = lang;
        host.dir = lang === "fa" ? "rtl" : "ltr";
        host.replaceChildren();
        build(host, lang);
        if (lang === "fa") {  // and again after every change the explorer makes to itself
          isolateLatin(host);
          new MutationObserver(() => isolateLatin(host)).observe(
            host, { childList: true, subtree: true, characterData: true });
        }
      }
    };
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
    else run();
  };

  globalThis.CourseExplorers = { digits, format, parse, element, svgElement, labelled, slider,
                                 select, sentence, fact, stepButtons, measuredNote, chartWidth,
                                 isolateRuns, mount };
})();

/*
 * Lesson 81's explorer: the capstone's memory per rank for a model of your depth and width on N
 * ranks, and the stored loss curve of the capstone command with a learning-rate spike, the
 * guard's rollback marked. The same arithmetic as lesson_code (tests/book/test_explorers.py):
 * `parameters` is models.gpt_parameters, `capstoneBytes` memory.capstone_bytes, `ddpBytes`
 * memory.bytes_per_rank("DDP", P, N, FP32_ADAM) and `ddpMasterBytes` the same with FP32_MASTER_ADAM. The curve is bench.capstone.read_curve's,
 * written into the page by the book's build (lesson_code.book_build.explorer_data).
 */
(() => {
  "use strict";
  const { digits, format, element, svgElement, labelled, slider, select, fact, measuredNote, chartWidth,
          mount } = globalThis.CourseExplorers;

  const parameters = ({ vocab_size: V, context: T, n_layer: L, n_embd: C }) =>
    V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C + V * C;
  const capstoneBytes = (params, worldSize) => {
    if (!Number.isInteger(worldSize) || worldSize < 1) {
      throw new RangeError(`world size ${worldSize}: use a whole number of ranks, such as 4`);
    }
    return { parameters: 4 * params, gradients: 4 * params, optimizer: 12 * Math.ceil(params / worldSize) };
  };
  const ddpBytes = (params) => ({ parameters: 4 * params, gradients: 4 * params, optimizer: 8 * params });
  const ddpMasterBytes = (params) => ({ ...ddpBytes(params), optimizer: 12 * params });  // the figure's DDP bar

  const PARTS = ["optimizer", "gradients", "parameters"];
  const WIDTHS = [32, 64, 128, 256, 512, 768, 1024, 2048];
  const TEXT = {
    en: { title: "The capstone's memory, and its loss curve", ranks: "Ranks N", layers: "Blocks",
          width: "Width", params: "Parameters", zero: "ZeRO-1 (the capstone)", ddp: "DDP with Adam (8P)",
          ddpMaster: "DDP with a master copy and Adam (12P)",
          optimizer: "optimizer state", gradients: "gradients", parameters: "weights",
          perRank: "per rank", saving: "ZeRO-1 saves per rank",
          curve: "Stored loss per step of the capstone command with a learning-rate spike at step 13",
          step: "step", loss: "loss (log scale)", rollback: "rolled back to step {to}",
          rejected: "step {at} rejected: loss {loss}", measured: "Measured on {date} on: ",
          memoryChart: "Bars: bytes per rank, optimizer state, gradients and weights" },
    fa: { title: "حافظهٔ پروژهٔ پایانی، و منحنی زیان آن", ranks: "تعداد رتبه‌ها N", layers: "تعداد بلوک‌ها",
          width: "پهنا", params: "پارامترها", zero: "ZeRO-1 (پروژهٔ پایانی)", ddp: "DDP با Adam (۸P)",
          ddpMaster: "DDP با رونوشت اصلی و Adam (۱۲P)",
          optimizer: "وضعیت بهینه‌ساز", gradients: "گرادیان‌ها", parameters: "وزن‌ها",
          perRank: "برای هر رتبه", saving: "صرفه‌جویی ZeRO-1 در هر رتبه",
          curve: "زیان ذخیره‌شدهٔ هر گام در فرمان پروژهٔ پایانی با جهش نرخ یادگیری در گام ۱۳",
          step: "گام", loss: "زیان (مقیاس لگاریتمی)", rollback: "بازگشت به گام {to}",
          rejected: "گام {at} رد شد: زیان {loss}", measured: "اندازه‌گیری‌شده در {date} روی: ",
          memoryChart: "میله‌ها: بایت‌های هر رتبه، وضعیت بهینه‌ساز، گرادیان‌ها و وزن‌ها" },
  };
  const megabytes = (bytes, lang) => `${format(bytes / 1e6, lang, bytes < 1e7 ? 2 : 0)} MB`;

  /* One bar per row, its name above it, its parts stacked from the left, its total after it;
     then the legend. Drawn at the column's width, so that its text stays legible on a phone. */
  const bars = (rows, lang, width) => {
    const t = TEXT[lang];
    const most = Math.max(...rows.map(([, bytes]) => PARTS.reduce((s, p) => s + bytes[p], 0)));
    const [rowHeight, barTop, legendTop] = [46, 18, rows.length * 46 + 8];
    const svg = svgElement("svg", { viewBox: `0 0 ${width} ${legendTop + 22}`, role: "img",
                                    "aria-label": t.memoryChart, class: "explorer__chart" });
    rows.forEach(([name, bytes], row) => {
      let x = 4;
      svg.append(svgElement("text", { x: 4, y: row * rowHeight + 12, class: "explorer__label" }, name));
      for (const part of PARTS) {
        const w = (bytes[part] / most) * (width - 90);
        svg.append(svgElement("rect", { x, y: row * rowHeight + barTop, width: Math.max(w, 0.5), height: 20,
                                        class: `explorer__part explorer__part--${part}` }));
        x += w;
      }
      svg.append(svgElement("text", { x: x + 6, y: row * rowHeight + barTop + 15, class: "explorer__label" },
                            megabytes(PARTS.reduce((s, p) => s + bytes[p], 0), lang)));
    });
    PARTS.forEach((part, index) => {
      const x = 4 + index * (width / 3);
      svg.append(svgElement("rect", { x, y: legendTop, width: 12, height: 12,
                                      class: `explorer__part explorer__part--${part}` }));
      svg.append(svgElement("text", { x: x + 18, y: legendTop + 11, class: "explorer__label" }, t[part]));
    });
    return svg;
  };

  const curve = (rows, lang, width) => {
    const t = TEXT[lang];
    const steps = rows.filter((r) => r.event === undefined);
    const events = rows.filter((r) => r.event === "rollback");
    const losses = rows.map((r) => r.loss);
    const [low, high] = [Math.log10(Math.min(...losses)), Math.log10(Math.max(...losses))];
    const last = Math.max(...rows.map((r) => r.step || r.at_step || 0));
    const [height, left, bottom] = [260, 60, 40];
    const x = (step) => left + (step / last) * (width - left - 20);
    const top = 30;  // room above the plot for the loss axis's name
    const y = (loss) => top + (1 - (Math.log10(loss) - low) / (high - low || 1)) * (height - bottom - top);
    const svg = svgElement("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": t.curve,
                                    class: "explorer__chart" });
    svg.append(svgElement("path", { d: steps.map((r, i) => `${i ? "L" : "M"}${x(r.step).toFixed(1)},${y(r.loss).toFixed(1)}`).join(""),
                                    class: "explorer__line" }));
    for (const r of steps) svg.append(svgElement("circle", { cx: x(r.step), cy: y(r.loss), r: 3, class: "explorer__point" }));
    for (const e of events) {
      svg.append(svgElement("line", { x1: x(e.to_step), x2: x(e.to_step), y1: top, y2: height - bottom,
                                      class: "explorer__rollback" }));
      svg.append(svgElement("text", { x: x(e.to_step) + 4, y: height - bottom - 6, class: "explorer__label" },
                            t.rollback.replace("{to}", digits(e.to_step, lang))));
      const before = steps.filter((r) => r.step === e.at_step - 1).pop();  // joined to the spike, as in the figure
      if (before) {
        svg.append(svgElement("line", { x1: x(before.step), y1: y(before.loss), x2: x(e.at_step), y2: y(e.loss),
                                        class: "explorer__rollback" }));
      }
      svg.append(svgElement("text", { x: x(e.at_step), y: y(e.loss) + 5, "text-anchor": "middle",
                                      class: "explorer__rejected" }, "✕"));
      const leftward = x(e.at_step) > width / 2;  // a label right of a late spike would leave a phone's chart
      svg.append(svgElement("text", { x: x(e.at_step) + (leftward ? -10 : 10), y: y(e.loss) + 5,
                                      "text-anchor": leftward ? "end" : "start", class: "explorer__label" },
                            t.rejected.replace("{at}", digits(e.at_step, lang)).replace("{loss}", format(e.loss, lang, 1))));
    }
    for (let step = 0; step <= last; step += 5) {
      svg.append(svgElement("text", { x: x(step), y: height - bottom + 18, "text-anchor": "middle",
                                      class: "explorer__label" }, digits(step, lang)));
    }
    for (const loss of [2, 3, 4, 10, 100].filter((v) => Math.log10(v) >= low - 0.01 && Math.log10(v) <= high + 0.01)) {
      svg.append(svgElement("text", { x: left - 6, y: y(loss) + 4, "text-anchor": "end",
                                      class: "explorer__label" }, digits(loss, lang)));
    }
    svg.append(svgElement("text", { x: (left + width) / 2, y: height - 4, "text-anchor": "middle",
                                    class: "explorer__label" }, t.step));
    svg.append(svgElement("text", { x: 4, y: 14, class: "explorer__label" }, t.loss));
    return svg;
  };

  const build = (host, lang) => {
    const t = TEXT[lang];
    const data = JSON.parse(document.getElementById("explorer-data").textContent);
    const ranks = slider("world_size", 1, 16, 4, lang);
    const layers = slider("n_layer", 1, 24, data.gpt.n_layer, lang);
    const width = select("n_embd", WIDTHS.map((w) => [String(w), digits(w, lang)]), String(data.gpt.n_embd));
    const memory = element("div", { className: "explorer__figure", dir: "ltr" });
    const facts = element("dl", { className: "explorer__facts" });
    const update = () => {
      const shape = { ...data.gpt, n_layer: Number(layers.input.value), n_embd: Number(width.value) };
      const p = parameters(shape);
      const n = Number(ranks.input.value);
      const zero = capstoneBytes(p, n);
      const ddp = ddpBytes(p);
      memory.replaceChildren(bars([[t.zero, zero], [t.ddp, ddp], [t.ddpMaster, ddpMasterBytes(p)]], lang, chartWidth(memory)));
      const total = (bytes) => PARTS.reduce((s, part) => s + bytes[part], 0);
      const row = (term, value, key) => fact(term, value, key);
      const grouped = p.toLocaleString("en-US");
      facts.replaceChildren(...row(t.params, lang === "fa" ? digits(grouped, lang).replace(/,/g, "٬") : grouped, "params"),
                            ...row(`${t.zero}${lang === "fa" ? "، " : ", "}${t.perRank}`, megabytes(total(zero), lang), "zero"),
                            ...row(t.saving, megabytes(total(ddp) - total(zero), lang), "saving"));
    };
    for (const control of [ranks.input, layers.input, width]) control.addEventListener("input", update);
    const curveFigure = element("div", { className: "explorer__figure", dir: "ltr" });
    host.append(element("p", { className: "explorer__title" }, t.title),
                element("div", { className: "explorer__controls" }, ranks.wrap(t.ranks),
                        layers.wrap(t.layers), labelled(t.width, width)),
                memory, facts,
                element("p", { className: "explorer__legend" }, t.curve),
                curveFigure, measuredNote(t.measured, data.measured, lang));
    update();
    curveFigure.append(curve(data.curve, lang, chartWidth(curveFigure)));
  };

  globalThis.Explorer81 = { parameters, capstoneBytes, ddpBytes, ddpMasterBytes };
  mount("81", build);
})();

/*
 * Lesson 78's memory calculator for the static book: no kernel, no network, no library.
 *
 * The same arithmetic as lesson_code.memory (bytes_per_rank, total_bytes): per parameter, a rank
 * keeps the model's weights, its gradients and K bytes of optimizer state, and ZeRO stage s
 * shards the first s of (optimizer state, gradients, weights) over the N ranks:
 *   DDP (2 + 2 + K) Psi,  ZeRO-1 (2 + 2) Psi + K Psi / N,  ZeRO-2 2 Psi + (2 + K) Psi / N,
 *   ZeRO-3 (2 + 2 + K) Psi / N      (mixed-precision Adam: 2-byte weights and gradients, K = 12).
 * Each rank also sends, per training step, what lesson_code.memory.traffic_per_step counts: one
 * all-reduce of the gradients under DDP, 2(N-1)/N Psi elements of the gradients' dtype; the same
 * under ZeRO-1 and 2 (a reduce-scatter and an all-gather); 3(N-1)/N Psi under ZeRO-3.
 * tests/book/test_memory_calculator.py compares these formulas with lesson_code.memory.
 *
 * It fills every <div class="memory-calculator"></div> of the page; when the page has none, it
 * places itself after the notebook cell that calls widgets.memory_calculator() (the live widget
 * of the notebook), else at the end of the article. Persian pages get Persian labels and digits.
 */
(() => {
  "use strict";
  const STAGES = ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"];
  const PRECISIONS = {
    mixed: { params: 2, grads: 2, optimizer: 12 },   // lesson_code.memory.MIXED_ADAM
    fp32: { params: 4, grads: 4, optimizer: 8 },     // lesson_code.memory.FP32_ADAM
  };
  // Divisors of (weights, gradients, optimizer state) for each stage, as in bytes_per_rank.
  const SHARDED = { "DDP": [0, 0, 0], "ZeRO-1": [0, 0, 1], "ZeRO-2": [0, 1, 1], "ZeRO-3": [1, 1, 1] };

  const bytesPerRank = (stage, params, worldSize, precision = PRECISIONS.mixed) => {
    if (!(stage in SHARDED)) throw new RangeError(`unknown stage ${stage}: use one of ${STAGES}`);
    if (!Number.isInteger(worldSize) || worldSize < 1) {
      throw new RangeError(`world size ${worldSize}: use a whole number of ranks, such as 8`);
    }
    const [p, g, o] = SHARDED[stage].map((sharded) => (sharded ? worldSize : 1));
    return { params: precision.params * params / p, grads: precision.grads * params / g,
             optimizer: precision.optimizer * params / o };
  };
  const VOLUMES = { "DDP": 2, "ZeRO-1": 2, "ZeRO-2": 2, "ZeRO-3": 3 };
  const trafficPerStep = (stage, params, worldSize, dtypeBytes = 2) => {
    bytesPerRank(stage, params, worldSize);  // the same checks of stage and world size
    return VOLUMES[stage] * ((worldSize - 1) / worldSize) * params * dtypeBytes;
  };
  const totalBytes = (stage, params, worldSize, precision = PRECISIONS.mixed) =>
    Object.values(bytesPerRank(stage, params, worldSize, precision)).reduce((a, b) => a + b, 0);

  const TEXT = {
    en: { title: "Memory per rank, without a kernel", params: "Parameters (billions)",
          ranks: "Ranks N", precision: "Precision", mixed: "mixed (bf16 + fp32 master)",
          fp32: "fp32", stage: "Stage", perParam: "Bytes per parameter", gb: "GB per rank",
          saving: "Saving vs DDP", traffic: "GB sent per rank per step",
          note: "Psi = number of parameters; activations not included. Traffic: gradients and weights in the gradients' dtype; every rank receives as many bytes as it sends." },
    fa: { title: "حافظهٔ هر رتبه، بدون کرنل", params: "تعداد پارامترها (میلیارد)",
          ranks: "تعداد رتبه‌ها \u2066N\u2069", precision: "دقت",
          mixed: "ترکیبی (\u2066bf16\u2069 با وزن‌های اصلی \u2066fp32\u2069)",
          fp32: "fp32", stage: "مرحله", perParam: "بایت برای هر پارامتر", gb: "گیگابایت در هر رتبه",
          saving: "صرفه‌جویی نسبت به \u2066DDP\u2069", traffic: "گیگابایت ارسالی هر رتبه در هر گام",
          note: "Ψ تعداد پارامترهاست؛ حافظهٔ فعال‌سازی‌ها حساب نشده است. ترافیک: گرادیان‌ها و وزن‌ها با نوع دادهٔ گرادیان‌ها؛ هر رتبه به همان اندازه که می‌فرستد دریافت هم می‌کند." },
  };
  const PERSIAN = "۰۱۲۳۴۵۶۷۸۹";
  /* Up to `digits` decimals, trailing zeros dropped (5.5, 4.19); Persian digits and ٫ for fa. */
  const format = (value, lang, digits = 2) => {
    const text = String(Number(value.toFixed(digits)));
    return lang === "fa" ? text.replace(/\d/g, (d) => PERSIAN[d]).replace(".", "٫") : text;
  };
  const parseNumber = (text) => Number(String(text).trim()
    .replace(/[۰-۹]/g, (d) => PERSIAN.indexOf(d)).replace(/[٫,]/g, "."));

  const rows = (billions, worldSize, precisionName, lang) => {
    const params = billions * 1e9;
    const precision = PRECISIONS[precisionName];
    const ddp = totalBytes("DDP", params, worldSize, precision);
    return STAGES.map((stage) => {
      const total = totalBytes(stage, params, worldSize, precision);
      return { stage, perParam: format(total / params, lang) + "Ψ", gb: format(total / 1e9, lang, 1),
               saving: format(100 * (1 - total / ddp), lang, 1) + (lang === "fa" ? "٪" : "%"),
               traffic: format(trafficPerStep(stage, params, worldSize, precision.grads) / 1e9, lang, 1) };
    });
  };

  const field = (label, input) => {
    const wrap = document.createElement("label");
    wrap.append(label, " ", input);
    return wrap;
  };

  const build = (host, lang) => {
    const t = TEXT[lang];
    host.lang = lang;
    host.dir = lang === "fa" ? "rtl" : "ltr";
    host.classList.add("memory-calculator");
    host.innerHTML = "";
    const title = document.createElement("p");
    title.className = "memory-calculator__title";
    title.textContent = t.title;
    const billions = Object.assign(document.createElement("input"),
      { type: "text", inputMode: "decimal", name: "billions", value: format(7.5, lang), size: 6 });
    const ranks = Object.assign(document.createElement("input"),
      { type: "text", inputMode: "numeric", name: "world_size", value: format(8, lang), size: 5 });
    const precision = document.createElement("select");
    precision.name = "precision";
    for (const name of Object.keys(PRECISIONS)) precision.add(new Option(t[name], name));
    const table = document.createElement("table");
    table.className = "memory-calculator__table";
    const note = document.createElement("p");
    note.className = "memory-calculator__note";
    const update = () => {
      const n = parseNumber(ranks.value);
      const p = parseNumber(billions.value);
      if (!Number.isInteger(n) || n < 1 || !(p > 0)) {
        note.textContent = lang === "fa" ? "\u2066N\u2069 باید عددی صحیح و مثبت و تعداد پارامترها مثبت باشد."
          : "N must be a positive whole number and the parameter count positive.";
        return;
      }
      note.textContent = t.note;
      const head = `<tr><th>${t.stage}</th><th>${t.perParam}</th><th>${t.gb}</th><th>${t.saving}</th><th>${t.traffic}</th></tr>`;
      table.innerHTML = head + rows(p, n, precision.value, lang).map((r) =>
        `<tr data-stage="${r.stage}"><td>${r.stage}</td><td class="per-param"><bdi>${r.perParam}</bdi></td>` +
        `<td class="gb">${r.gb}</td><td class="saving"><bdi>${r.saving}</bdi></td>` +
        `<td class="traffic">${r.traffic}</td></tr>`).join("");
    };
    for (const input of [billions, ranks, precision]) input.addEventListener("input", update);
    const controls = document.createElement("div");
    controls.className = "memory-calculator__controls";
    controls.append(field(t.params, billions), field(t.ranks, ranks), field(t.precision, precision));
    host.append(title, controls, table, note);
    update();
  };

  const place = () => {
    const lang = document.body.classList.contains("lang-fa") ? "fa" : "en";
    let hosts = [...document.querySelectorAll("div.memory-calculator")];
    if (!hosts.length) {
      const host = document.createElement("div");
      const cell = [...document.querySelectorAll("article .cell")]
        .find((c) => (c.querySelector(".cell_input") || c).textContent.includes("memory_calculator("));
      if (cell) cell.after(host);
      else (document.querySelector("article.bd-article") || document.body).append(host);
      hosts = [host];
    }
    for (const host of hosts) build(host, lang);
  };

  // The formulas, for the page's other scripts and for the test that runs this file under node.
  globalThis.MemoryCalculator = { STAGES, PRECISIONS, bytesPerRank, totalBytes, trafficPerStep,
                                  format, rows };
  if (typeof document === "undefined") return;
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", place);
  else place();
})();

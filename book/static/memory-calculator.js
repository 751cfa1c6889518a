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
 * of the notebook); a page with neither gets no calculator. Persian pages get Persian labels and
 * digits. Under it, when the page holds them as JSON (lesson_code.book_build.explorer_data, with
 * explorer-common.js loaded), the bytes per rank that lesson 78b's scale lab measured on 1 to 512
 * simulated ranks for the one model it simulated, beside the formulas' bytes for that model
 * (measuredRows, compared with the stored sweep by tests/book/test_memory_calculator.py).
 *
 * Lesson 78a's explorer is here too, beside the formulas it shares: one ZeRO-3 step, event by
 * event, as lesson_code.memory.stage3_step models it (stage3Step below, compared with the Python
 * by tests/book/test_memory_calculator.py), for the units of the MiniGPT that lesson 78a measures
 * and the peaks measured there, which the page holds as JSON (lesson_code.book_build.explorer_data).
 * It fills <div class="explorer" data-explorer="78a"> through explorer-common.js.
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

  /* The scale lab's points for `strategy`: per simulated world size N, the model state a rank
     kept after one step (bytes, as measured) and what totalBytes gives for that model in mixed
     precision, the sweep's precision (`data` is explorer_data.scale_points); shown in MB. */
  const measuredRows = (data, strategy, lang) => data.points[strategy].map((point) => {
    const formula = totalBytes(strategy, data.model.parameters, point.N, PRECISIONS.mixed);
    return { N: point.N, bytes: point.model_states, formulaBytes: formula, n: format(point.N, lang),
             measured: format(point.model_states / 1e6, lang), formula: format(formula / 1e6, lang) };
  });

  const MEASURED_TEXT = {
    en: { title: "Measured by the scale lab of ", lesson: "lesson 78b",
          model: "For one model only, not the parameters above: lesson 77's MiniGPT, Ψ = {params} parameters, {dtype} weights and gradients with an fp32 master copy and moments (the mixed precision above).",
          strategy: "Strategy", measured: "Measured, MB per rank", formula: "Formula, MB per rank",
          note: "Measured: the model state a rank keeps after one step (weights, gradients, optimizer state); where it differs from the formula, lesson 78b says why (DDP also keeps a copy of its gradients in its buckets, 2Ψ more). Buffers, activations and the step's peak are not in it. 1 MB = 10⁶ bytes.",
          source: "Simulated ranks, counted on {date} on " },
    fa: { title: "اندازه‌گیری‌شده با آزمایشگاه مقیاسِ ", lesson: "درس ۷۸ب",
          model: "فقط برای یک مدل، نه تعداد پارامترهای بالا: MiniGPT درس ۷۷ با \u2066Ψ = {params}\u2069 پارامتر، وزن‌ها و گرادیان‌های {dtype} با رونوشت اصلی و گشتاورهای fp32 (همان دقت ترکیبی بالا).",
          strategy: "راهبرد", measured: "اندازه‌گیری‌شده، مگابایت در هر رتبه", formula: "فرمول، مگابایت در هر رتبه",
          note: "اندازه‌گیری‌شده: وضعیت مدلی که یک رتبه پس از یک گام نگه می‌دارد (وزن‌ها، گرادیان‌ها، وضعیت بهینه‌ساز)؛ هر جا با فرمول فرق دارد، درس ۷۸ب دلیلش را می‌گوید (DDP رونوشتی از گرادیان‌ها را هم در باکت‌هایش نگه می‌دارد، \u2066۲Ψ\u2069 بیشتر). بافرها، فعال‌سازی‌ها و بیشینهٔ حافظهٔ گام در آن نیستند. هر مگابایت یک میلیون بایت است.",
          source: "رتبه‌های شبیه‌سازی‌شده، شمرده در {date} روی " },
  };

  /* The measured points under the calculator, for the strategy the reader picks; null on a page
     without them (or without explorer-common.js, whose helpers write the Persian text). */
  const measuredSection = (lang) => {
    const json = document.getElementById("explorer-data");
    const data = json && JSON.parse(json.textContent);
    if (!globalThis.CourseExplorers || !data || !data.points) return null;
    const { element, digits, isolateRuns, labelled, select, measuredNote } = globalThis.CourseExplorers;
    const t = MEASURED_TEXT[lang];
    const say = (text) => (lang === "fa" ? isolateRuns(text) : text);
    const grouped = digits(String(data.model.parameters).replace(/\B(?=(\d{3})+$)/g, lang === "fa" ? "٬" : ","), lang);
    const strategy = select("strategy", STAGES.filter((s) => s in data.points).map((s) => [s, s]), "ZeRO-3");
    const table = element("table", { className: "memory-calculator__table memory-calculator__measured" });
    const update = () => {
      const head = element("tr", {}, ...[TEXT[lang].ranks, t.measured, t.formula].map((text) => element("th", {}, text)));
      table.replaceChildren(head, ...measuredRows(data, strategy.value, lang).map((row) => {
        const line = element("tr", {}, element("td", {}, row.n), element("td", { className: "measured" }, row.measured),
                             element("td", { className: "formula" }, row.formula));
        line.dataset.n = row.N;
        line.dataset.bytes = row.bytes;
        return line;
      }));
    };
    strategy.addEventListener("input", update);
    update();
    const source = measuredNote(t.source, data.measured, lang);
    source.append(".");
    return element("div", { className: "memory-calculator__scale-lab" },
      element("p", { className: "memory-calculator__title" }, t.title,
              element("a", { href: "78b-scale-lab.html" }, t.lesson)),
      element("p", {}, say(t.model.replace("{params}", grouped).replace("{dtype}", data.dtype))),
      element("div", { className: "memory-calculator__controls" }, labelled(t.strategy, strategy)),
      table, element("p", { className: "memory-calculator__note" }, say(t.note)), source);
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
    const measured = measuredSection(lang);
    if (measured) host.append(measured);
  };

  const place = () => {
    const lang = document.body.classList.contains("lang-fa") ? "fa" : "en";
    let hosts = [...document.querySelectorAll("div.memory-calculator")];
    if (!hosts.length) {
      const host = document.createElement("div");
      const cell = [...document.querySelectorAll("article .cell")]
        .find((c) => (c.querySelector(".cell_input") || c).textContent.includes("memory_calculator("));
      if (!cell) return;  // a page of the book without the calculator (lesson 78a's explorer)
      cell.after(host);
      hosts = [host];
    }
    for (const host of hosts) build(host, lang);
  };

  /* Lesson 78a: the bytes a ZeRO-3 rank holds through one step, event by event, as
     lesson_code.zero3 allocates them (memory.stage3_step): each unit padded to N chunks of
     ceil(P_u / N), the rank's chunk kept with its fp32 master and moments; forward gathers and
     frees each unit; backward gathers it again, fills its gradient bucket, reduce-scatters it into
     the gradient shard (allocated whole at the first reduce-scatter) and frees the unit. */
  const STAGE3_PRECISIONS = {
    fp32master: { params: 4, grads: 4, optimizer: 12 },   // memory.FP32_MASTER_ADAM: as measured
    mixed: PRECISIONS.mixed,
  };
  const stage3Step = (units, worldSize, precision = STAGE3_PRECISIONS.fp32master) => {
    if (!Number.isInteger(worldSize) || worldSize < 1) {
      throw new RangeError(`world size ${worldSize}: use a whole number of ranks, such as 8`);
    }
    const shards = new Map(units.map(([name, numel]) => {
      if (!Number.isInteger(numel) || numel < 1) throw new RangeError(`unit ${name} has ${numel} parameters`);
      return [name, Math.ceil(numel / worldSize)];
    }));
    const owned = [...shards.values()].reduce((a, b) => a + b, 0);
    const events = [{ unit: "", pass: "", action: "start", change: 0,
                      held: (precision.params + precision.optimizer) * owned }];
    const add = (unit, pass, action, change) =>
      events.push({ unit, pass, action, change, held: events[events.length - 1].held + change });
    for (const [name] of units) {
      const gathered = precision.params * shards.get(name) * worldSize;
      add(name, "forward", "gather", gathered);
      add(name, "forward", "compute", 0);
      add(name, "forward", "free", -gathered);
    }
    [...units].reverse().forEach(([name], index) => {
      const gathered = precision.params * shards.get(name) * worldSize;
      const bucket = precision.grads * shards.get(name) * worldSize;
      add(name, "backward", "gather", gathered);
      add(name, "backward", "compute", bucket);
      add(name, "backward", "reduce-scatter", (index === 0 ? precision.grads * owned : 0) - bucket);
      add(name, "backward", "free", -gathered);
    });
    return events;
  };

  const STEP_TEXT = {
    en: { title: "One ZeRO-3 step, event by event (model)", ranks: "Ranks N", precision: "Precision",
          fp32master: "fp32, as measured", mixed: "mixed (bf16 + fp32 master)",
          event: "Event", previous: "◀ previous", next: "next ▶", held: "Held between steps",
          now: "This event", peak: "Modelled peak", measured: "Measured peak (stored table)",
          unmeasured: "measured for N = 1, 2 and 4, fp32 only",
          chart: "Bytes a rank holds through the step, one bar per event",
          axis: "events: forward, then backward", start: "start of the step",
          gather: "gather", compute: "compute", "reduce-scatter": "reduce-scatter", free: "free",
          forward: "forward", backward: "backward", embed: "embedding", block: "block", head: "head",
          during: "{action} of {unit}, {pass}", change: "{change} MB, {held} MB held",
          note: "The model leaves out activations and temporaries; the peaks were measured on {date} on " },
    fa: { title: "یک گام ZeRO-3، رویداد به رویداد (مدل)", ranks: "تعداد رتبه‌ها \u2066N\u2069",
          precision: "دقت", fp32master: "\u2066fp32\u2069، همان که اندازه‌گیری شد",
          mixed: "ترکیبی (\u2066bf16\u2069 با وزن‌های اصلی \u2066fp32\u2069)",
          event: "رویداد", previous: "◀ قبلی", next: "بعدی ▶", held: "نگه‌داشته میان گام‌ها",
          now: "همین رویداد", peak: "بیشینهٔ مدل", measured: "بیشینهٔ اندازه‌گیری‌شده (جدول ذخیره‌شده)",
          unmeasured: "فقط برای \u2066N\u2069 برابر ۱، ۲ و ۴، با \u2066fp32\u2069 اندازه‌گیری شده است",
          chart: "بایت‌هایی که یک رتبه در طول گام نگه می‌دارد، یک ستون برای هر رویداد",
          axis: "رویدادها: گذر رفت، سپس گذر برگشت", start: "آغاز گام",
          gather: "گردآوری همگانی", compute: "محاسبه", "reduce-scatter": "کاهش و پخش", free: "آزادسازی",
          forward: "گذر رفت", backward: "گذر برگشت", embed: "لایهٔ جاسازی", block: "بلوک",
          head: "لایهٔ خروجی", during: "{action} {unit}، {pass}", change: "{change} مگابایت، {held} مگابایت نگه‌داشته",
          note: "مدل فعال‌سازی‌ها و تنسورهای موقت را نمی‌شمارد؛ بیشینه‌ها در {date} اندازه‌گیری شدند، روی " },
  };
  const ACTION_COLOURS = { start: "#c7c7c7", gather: "#1f77b4", compute: "#2ca02c",
                           "reduce-scatter": "#ff7f0e", free: "#7f7f7f" };

  const unitName = (name, t, lang) => {
    const block = name.match(/^blocks\.(\d+)$/);
    if (block) return `${t.block} ${format(Number(block[1]), lang)}`;
    return t[name] || name;
  };
  const fill = (template, values) => template.replace(/\{(\w+)\}/g, (_, key) => values[key]);
  const describe = (event, t, lang) => (event.action === "start" ? t.start
    : fill(t.during, { action: t[event.action], unit: unitName(event.unit, t, lang), pass: t[event.pass] }));

  const drawStep = (events, current, t, lang) => {
    const { svgElement } = globalThis.CourseExplorers;
    const width = 720, height = 240, left = 56, bottom = 40, top = 22;
    const most = Math.max(...events.map((e) => e.held));
    const x = (i) => left + (i + 0.5) * (width - left - 4) / events.length;
    const y = (bytes) => top + (height - top - bottom) * (1 - bytes / most);
    const bar = (width - left - 4) / events.length;
    const svg = svgElement("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": t.chart,
                                    class: "explorer__chart explorer__chart--wide" });
    for (const fraction of [0, 0.5, 1]) {
      svg.append(svgElement("text", { x: left - 6, y: y(fraction * most) + 4, "text-anchor": "end",
                                      class: "explorer__label" }, format(fraction * most / 1e6, lang, 1)));
    }
    events.forEach((event, i) => {
      svg.append(svgElement("rect", { x: x(i) - bar / 2 + 0.5, y: y(event.held), width: bar - 1,
                                      height: y(0) - y(event.held), fill: ACTION_COLOURS[event.action],
                                      opacity: i === current ? 1 : 0.55, "data-action": event.action }));
    });
    svg.append(svgElement("rect", { x: x(current) - bar / 2, y: top, width: bar, height: y(0) - top,
                                    fill: "none", stroke: "#d62728", "stroke-width": 2, class: "explorer__current" }));
    svg.append(svgElement("text", { x: (left + width) / 2, y: height - 12, "text-anchor": "middle",
                                    class: "explorer__label" }, t.axis));
    svg.append(svgElement("text", { x: left - 6, y: 12, "text-anchor": "end", class: "explorer__label" }, "MB"));
    return svg;
  };

  const buildStep = (host, lang) => {
    const { element, labelled, slider, select, fact, stepButtons, measuredNote } = globalThis.CourseExplorers;
    const t = STEP_TEXT[lang];
    const data = JSON.parse(document.getElementById("explorer-data").textContent);
    const ranks = slider("world_size", 1, 64, 4, lang);
    const precision = select("precision", [["fp32master", t.fp32master], ["mixed", t.mixed]], "fp32master");
    const event = slider("event", 0, 1, 0, lang);
    const figure = element("div", { className: "explorer__figure", dir: "ltr" });
    const facts = element("dl", { className: "explorer__facts" });
    const mb = (bytes) => format(bytes / 1e6, lang, 2);
    const legend = element("p", { className: "explorer__legend" }, ...Object.entries(ACTION_COLOURS).flatMap(
      ([action, colour]) => [element("span", { className: "explorer__swatch", style: `background: ${colour}` }),
                             ` ${action === "start" ? t.start : t[action]}  `]));
    const update = () => {
      const n = Number(ranks.input.value);
      const events = stage3Step(data.units, n, STAGE3_PRECISIONS[precision.value]);
      event.input.max = events.length - 1;
      const i = Math.min(Number(event.input.value), events.length - 1);
      event.shown.textContent = format(i, lang);
      const top = events.reduce((a, b) => (b.held > a.held ? b : a));
      const stored = data.measured_peaks[String(n)];
      const sign = events[i].change > 0 ? "+" : events[i].change < 0 ? "−" : "";
      figure.replaceChildren(drawStep(events, i, t, lang));
      facts.replaceChildren(
        ...fact(t.held, `${mb(events[0].held)} MB`, "held"),
        ...fact(t.now, [describe(events[i], t, lang), ": ", fill(t.change, {
          change: sign + mb(Math.abs(events[i].change)), held: mb(events[i].held) })], "event"),
        ...fact(t.peak, [`${mb(top.held)} MB${lang === "fa" ? "، " : ", "}`, describe(top, t, lang)], "peak"),
        ...fact(t.measured, stored && precision.value === "fp32master"
          ? `${mb(stored.peak)} MB` : t.unmeasured, "measured"));
    };
    for (const control of [ranks.input, precision, event.input]) control.addEventListener("input", update);
    host.append(element("p", { className: "explorer__title" }, t.title),
                element("div", { className: "explorer__controls" }, ranks.wrap(t.ranks),
                        labelled(t.precision, precision), event.wrap(t.event),
                        ...stepButtons(event, t, update)),
                figure, legend, facts, measuredNote(t.note, data.measured, lang));
    update();
  };

  // The formulas, for the page's other scripts and for the test that runs this file under node.
  globalThis.MemoryCalculator = { STAGES, PRECISIONS, bytesPerRank, totalBytes, trafficPerStep,
                                  format, rows, measuredRows, STAGE3_PRECISIONS, stage3Step };
  if (typeof document === "undefined") return;
  if (globalThis.CourseExplorers) globalThis.CourseExplorers.mount("78a", buildStep);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", place);
  else place();
})();

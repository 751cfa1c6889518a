/*
 * Lesson 76's explorer: the ring all-reduce step by step, and what each algorithm would cost.
 * The same arithmetic as lesson_code (tests/book/test_explorers.py compares them on a grid):
 * `chunks(phase, r, s, n)` is ring.ring_chunk_indices at step s + 1, `states` is
 * plots.collectives.ring_states, `messages`, `bytesPerRank` and `predict` are
 * collectives.cost_model's, `chooses` is choose.Decisions.choose.
 * The times are modelled for the lesson's cluster, one alpha and beta for every algorithm
 * (cost_model.CLUSTER); auto's decisions come from the book's stored times. Both are written into
 * the page by the book's build (lesson_code.book_build.explorer_data).
 */
(() => {
  "use strict";
  const { digits, format, element, svgElement, labelled, slider, select, sentence, fact, stepButtons,
          measuredNote, mount } = globalThis.CourseExplorers;
  const mod = (a, n) => ((a % n) + n) % n;

  const chunks = (phase, rank, step, n) => (phase === "reduce_scatter"
    ? [mod(rank - step - 1, n), mod(rank - step - 2, n)] : [mod(rank - step, n), mod(rank - step - 1, n)]);

  /* After each step: state[r][c] lists (sorted) the ranks whose data rank r's chunk c holds. */
  const states = (n) => {
    let state = [...Array(n).keys()].map((r) => Array(n).fill(null).map(() => [r]));
    const frames = [];
    for (const phase of ["reduce_scatter", "all_gather"]) {
      for (let step = 0; step < n - 1; step += 1) {
        const sent = [];
        const next = state.map((row) => row.slice());
        for (let rank = 0; rank < n; rank += 1) {
          const [send, receive] = chunks(phase, rank, step, n);
          sent.push([rank, send]);
          const incoming = state[mod(rank - 1, n)][receive];
          next[rank][receive] = phase === "reduce_scatter"
            ? [...new Set([...incoming, ...state[rank][receive]])].sort((a, b) => a - b) : incoming;
        }
        state = next;
        frames.push({ phase, step, state, sent });
      }
    }
    return frames;
  };

  const split = (n) => {
    const power = 2 ** Math.floor(Math.log2(n));
    return [power, n - power];
  };
  const messages = (model, n) => {
    const [power, extra] = split(n);
    const rounds = Math.log2(power);
    const fold = extra ? 2 : 0;
    return { recursive_doubling: rounds + fold, halving_doubling: 2 * rounds + fold,
             all_reduce: 2 * (n - 1), naive_all_reduce: 2 * (n - 1), direct_all_reduce: 2 * (n - 1),
             shared_memory_all_reduce: 4 * (n - 1) }[model];
  };
  const bytesPerRank = (model, nbytes, n) => {
    const [power, extra] = split(n);
    const fold = extra ? 2 * nbytes : 0;
    return { recursive_doubling: Math.log2(power) * nbytes + fold,
             halving_doubling: 2 * (power - 1) / power * nbytes + fold,
             all_reduce: 2 * (n - 1) / n * nbytes, naive_all_reduce: 2 * (n - 1) * nbytes,
             direct_all_reduce: 2 * (n - 1) / n * nbytes,
             shared_memory_all_reduce: n > 1 ? 3 * nbytes : 0 }[model];
  };
  const predict = (model, nbytes, n, alpha, beta) =>
    messages(model, n) * alpha + bytesPerRank(model, nbytes, n) * beta;
  const chooses = (table, nbytes) => {
    let index = 0;
    while (index + 1 < table.starts.length && table.starts[index + 1] <= nbytes) index += 1;
    return table.algorithms[index];
  };

  const SIZES = [2 ** 10, 2 ** 14, 2 ** 18, 2 ** 20, 2 ** 22, 2 ** 24, 2 ** 26];
  const size = (nbytes, lang) => {
    const [value, unit] = nbytes >= 2 ** 20 ? [nbytes / 2 ** 20, "MiB"] : [nbytes / 2 ** 10, "KiB"];
    return `${format(value, lang)} ${unit}`;  // in Persian read from the right: the number, then the unit
  };
  const TEXT = {
    en: { title: "The ring all-reduce, step by step", ranks: "Ranks N", size: "Message",
          step: "Step of the all-reduce", previous: "Previous step", next: "Next step", start: "Each rank holds its own tensor",
          reduce_scatter: "Reduce-scatter, step k = {k} of {t}: rank r sends chunk {f} to rank {next}, which adds it",
          all_gather: "All-gather, step k = {k} of {t}: rank r sends chunk {f} to rank {next}, which keeps it",
          rank: "rank", chunk: "chunk", sent: "outlined: the chunk each rank sends in this step",
          bytes: "Bytes each rank sends in the whole ring all-reduce, {f} × message",
          algorithm: "algorithm", steps: "messages in a row", perRank: "bytes on the critical path (β term)",
          time: "modelled time on the cluster (ms)", auto: "auto runs this", fastest: "fastest by the model",
          chart: "Rows: ranks; columns: chunks; each cell lists the ranks whose data it holds",
          names: { ring: "ring", recursive_doubling: "recursive doubling", halving_doubling: "halving-doubling",
                   naive: "naive (through rank 0)", direct: "direct", shared_memory: "shared memory (one machine)" },
          fitted: "Times modelled for a cluster, not measured: every row uses the lesson's α = 5 µs and 1/β = 25 GB/s. ★ marks what auto would run, which it decides from the book's stored times of 4 ranks on 2 cores, measured on {date} on this machine: " },
    fa: { title: "کاهش همگانی حلقه‌ای، گام به گام", ranks: "تعداد رتبه‌ها N", size: "اندازهٔ پیام",
          step: "گام کاهش همگانی", previous: "گام قبل", next: "گام بعد", start: "هر رتبه تنسور خودش را دارد",
          reduce_scatter: "کاهش و پخش، گام k = {k} از {t}: رتبهٔ r تکهٔ {f} را به رتبهٔ {next} می‌فرستد و آن رتبه آن را جمع می‌کند",
          all_gather: "گردآوری همگانی، گام k = {k} از {t}: رتبهٔ r تکهٔ {f} را به رتبهٔ {next} می‌فرستد و آن رتبه آن را نگه می‌دارد",
          rank: "رتبه", chunk: "تکه", sent: "قاب پررنگ: تکه‌ای که هر رتبه در این گام می‌فرستد",
          bytes: "بایت‌هایی که هر رتبه در کل کاهش همگانی حلقه‌ای می‌فرستد، {f} × پیام",
          algorithm: "الگوریتم", steps: "پیام‌های پشت سر هم", perRank: "بایت روی مسیر بحرانی (جملهٔ β)",
          time: "زمان روی خوشه بنا بر مدل (میلی‌ثانیه)", auto: "auto این را اجرا می‌کند", fastest: "سریع‌ترین بنا بر مدل",
          chart: "سطرها رتبه‌ها و ستون‌ها تکه‌ها هستند؛ هر تکه رتبه‌هایی را نشان می‌دهد که داده‌شان در آن است",
          names: { ring: "حلقه", recursive_doubling: "دوبرابرسازی بازگشتی", halving_doubling: "نیم‌سازی و دوبرابرسازی",
                   naive: "ساده‌لوحانه (از راه رتبهٔ ۰)", direct: "مستقیم", shared_memory: "حافظهٔ مشترک (یک دستگاه)" },
          fitted: "زمان‌ها بنا بر مدل برای یک خوشه‌اند، نه اندازه‌گیری‌شده: همهٔ سطرها α = ۵ µs و 1/β = ۲۵ GB/s را به کار می‌برند، همان ثابت‌های خوشه در درس. ★ الگوریتمی را نشان می‌دهد که auto اجرا می‌کند؛ auto آن را از زمان‌های ذخیره‌شدهٔ کتاب برای ۴ رتبه روی ۲ هسته انتخاب می‌کند که در {date} روی این دستگاه اندازه‌گیری شدند: " },
  };
  const CELL = 34;
  /* The chunk rank r sends in step k = 1 .. N − 1 of a phase, as the lesson and
     ring_chunk_indices number steps (k is a frame's step + 1). */
  const FORMULAS = { reduce_scatter: "(r − k) mod N", all_gather: "(r − k + 1) mod N" };
  const caption = (frame, n) => ({ phase: frame.phase, f: FORMULAS[frame.phase], next: "(r + 1) mod N",
                                   k: frame.step + 1, t: n - 1 });

  const grid = (frame, n, lang) => {
    const t = TEXT[lang];
    const side = 40 + n * CELL;
    const svg = svgElement("svg", { viewBox: `0 0 ${side} ${side}`, role: "img", "aria-label": t.chart,
                                    class: "explorer__chart explorer__chart--square" });
    const state = frame ? frame.state : [...Array(n).keys()].map((r) => Array(n).fill([r]));
    const sent = new Set((frame ? frame.sent : []).map(([r, c]) => `${r},${c}`));
    for (let i = 0; i < n; i += 1) {
      svg.append(svgElement("text", { x: 40 + i * CELL + CELL / 2, y: 24, "text-anchor": "middle",
                                      class: "explorer__label" }, digits(i, lang)));
      svg.append(svgElement("text", { x: 30, y: 40 + i * CELL + CELL / 2 + 4, "text-anchor": "end",
                                      class: "explorer__label" }, digits(i, lang)));
    }
    state.forEach((row, rank) => row.forEach((held, chunk) => {
      const x = 40 + chunk * CELL;
      const y = 40 + rank * CELL;
      const share = held.length / n;
      svg.append(svgElement("rect", { x: x + 1, y: y + 1, width: CELL - 2, height: CELL - 2,
                                      class: "explorer__cell", "fill-opacity": (0.15 + 0.85 * share).toFixed(3),
                                      "data-held": held.length }));
      if (sent.has(`${rank},${chunk}`)) {
        svg.append(svgElement("rect", { x: x + 3, y: y + 3, width: CELL - 6, height: CELL - 6,
                                        class: "explorer__sent" }));
      }
      const label = held.length === n ? "Σ" : n <= 5 ? held.map((r) => digits(r, lang)).join("")
        : digits(held.length, lang);
      svg.append(svgElement("text", { x: x + CELL / 2, y: y + CELL / 2 + 4, "text-anchor": "middle",
                                      class: `explorer__micro${share > 0.5 ? " explorer__micro--light" : ""}` },
                            label));
    }));
    return svg;
  };

  const build = (host, lang) => {
    const t = TEXT[lang];
    const data = JSON.parse(document.getElementById("explorer-data").textContent);
    const ranks = slider("world_size", 2, 16, 4, lang);
    const message = select("nbytes", SIZES.map((n) => [String(n), size(n, lang)]), String(2 ** 20));
    const step = slider("step", 0, 6, 0, lang);
    const shownCaption = element("p", { className: "explorer__caption" });
    const figure = element("div", { className: "explorer__figure", dir: "ltr" });
    const facts = element("dl", { className: "explorer__facts" });
    const table = element("table", { className: "explorer__table" });
    const update = () => {
      const n = Number(ranks.input.value);
      const nbytes = Number(message.value);
      const last = 2 * (n - 1);
      step.input.max = last;
      if (Number(step.input.value) > last) step.input.value = last;
      step.shown.textContent = digits(step.input.value, lang);
      const s = Number(step.input.value);
      const frame = s ? states(n)[s - 1] : null;
      if (frame) {
        const words = caption(frame, n);
        shownCaption.replaceChildren(...sentence(t[words.phase], { ...words, k: digits(words.k, lang),
          t: digits(words.t, lang) }, ["f", "next"]));
      } else shownCaption.textContent = t.start;
      figure.replaceChildren(grid(frame, n, lang), element("p", { className: "explorer__legend" }, t.sent));
      const sentBytes = bytesPerRank("all_reduce", nbytes, n);
      facts.replaceChildren(...fact(sentence(t.bytes, { f: "2(N − 1)/N" }, ["f"]),
                                    `${format(sentBytes / 2 ** 20, lang, 3)} MiB`, "bytes"));
      const times = Object.entries(data.models).map(([name, model]) =>
        [name, predict(model, nbytes, n, ...data.cluster)]);
      const fastest = times.reduce((best, row) => (row[1] < best[1] ? row : best))[0];
      const auto = chooses(data.decisions[String(n)], nbytes);
      const head = element("tr", {}, ...[t.algorithm, t.steps, t.perRank, t.time].map((h) => element("th", {}, h)));
      table.replaceChildren(head, ...times.map(([name, seconds]) => {
        const marks = [name === auto ? `★ ${t.auto}` : "", name === fastest ? t.fastest : ""].filter(Boolean);
        const row = element("tr", {},
          element("td", {}, t.names[name], marks.length ? element("span", { className: "explorer__mark" }, ` (${marks.join(lang === "fa" ? "، " : ", ")})`) : ""),
          element("td", {}, digits(messages(data.models[name], n), lang)),
          element("td", {}, size(bytesPerRank(data.models[name], nbytes, n), lang)),
          element("td", {}, format(seconds * 1e3, lang, 3)));
        row.dataset.algorithm = name;
        row.dataset.auto = String(name === auto);
        return row;
      }));
    };
    for (const control of [ranks.input, message, step.input]) control.addEventListener("input", update);
    host.append(element("p", { className: "explorer__title" }, t.title),
                element("div", { className: "explorer__controls" }, ranks.wrap(t.ranks),
                        labelled(t.size, message), step.wrap(t.step), ...stepButtons(step, t, update)),
                shownCaption, figure, facts, element("div", { className: "explorer__scroll" }, table),
                measuredNote(t.fitted, data.measured, lang));
    update();
  };

  globalThis.Explorer76 = { chunks, states, caption, messages, bytesPerRank, predict, chooses };
  mount("76", build);
})();

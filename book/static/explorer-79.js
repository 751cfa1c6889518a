/*
 * Lesson 79's explorer: the schedule of a pipeline step, GPipe or 1F1B, for P stages and m
 * micro-batches. The same arithmetic as lesson_code.pipeline (tests/book/test_explorers.py
 * compares them on a grid): `order` is schedule_order, `timeline` is ideal_timeline (equal stages,
 * a backward twice a forward, free messages), `bubble` is bubble_fraction, `peak` peak_in_flight.
 */
(() => {
  "use strict";
  const { digits, format, element, svgElement, labelled, slider, select, sentence, fact, mount } = globalThis.CourseExplorers;

  const order = (schedule, stage, stages, micro) => {
    if (schedule === "gpipe") {
      return [...Array(micro).keys()].map((i) => ["F", i])
        .concat([...Array(micro).keys()].map((i) => ["B", i]));
    }
    const warmup = Math.min(stages - stage - 1, micro);
    const steps = [...Array(warmup).keys()].map((i) => ["F", i]);
    for (let i = 0; i < micro - warmup; i += 1) steps.push(["F", warmup + i], ["B", i]);
    for (let i = micro - warmup; i < micro; i += 1) steps.push(["B", i]);
    return steps;
  };

  const timeline = (schedule, stages, micro, forward = 1, backward = 2) => {
    const orders = [...Array(stages).keys()].map((s) => order(schedule, s, stages, micro));
    const done = new Map();
    const free = Array(stages).fill(0);
    const next = Array(stages).fill(0);
    const events = [];
    while (events.length < 2 * micro * stages) {
      const before = events.length;
      orders.forEach((steps, stage) => {
        while (next[stage] < steps.length) {
          const [kind, i] = steps[next[stage]];
          const needs = kind === "F" ? `${stage - 1}F${i}`
            : stage < stages - 1 ? `${stage + 1}B${i}` : `${stage}F${i}`;
          let ready;
          if (kind === "F" && stage === 0) ready = 0;
          else if (done.has(needs)) ready = done.get(needs);
          else break;
          const start = Math.max(free[stage], ready);
          free[stage] = start + (kind === "F" ? forward : backward);
          done.set(`${stage}${kind}${i}`, free[stage]);
          events.push([stage, i, kind, start, free[stage]]);
          next[stage] += 1;
        }
      });
      if (events.length === before) throw new Error(`${schedule} P=${stages} m=${micro} deadlocks`);
    }
    return events.sort((a, b) => a[0] - b[0] || a[3] - b[3]);
  };

  const bubble = (events, stages) => {
    const start = Math.min(...events.map((e) => e[3]));
    const end = Math.max(...events.map((e) => e[4]));
    const busy = events.reduce((sum, e) => sum + e[4] - e[3], 0);
    return 1 - busy / (stages * (end - start));
  };
  const theoretical = (stages, micro) => (stages - 1) / (micro + stages - 1);
  const peak = (steps) => {
    let held = 0;
    let most = 0;
    for (const [kind] of steps) {
      held += kind === "F" ? 1 : -1;
      most = Math.max(most, held);
    }
    return most;
  };

  const TEXT = {
    en: { title: "A pipeline step, slot by slot", schedule: "Schedule", stages: "Stages P",
          micro: "Micro-batches m", stage: "stage", forward: "forward", backward: "backward (twice as long)",
          formula: "Bubble {f}", idle: "Idle share of the chart",
          held: "Most micro-batches whose activations a stage holds",
          chart: "Gantt chart: one row per stage, time to the right" },
    fa: { title: "یک گام پایپلاین، بازه به بازه", schedule: "زمان‌بندی", stages: "تعداد مرحله‌ها P",
          micro: "تعداد میکرودسته‌ها m", stage: "مرحلهٔ", forward: "گذر رفت", backward: "گذر برگشت (دو برابرِ گذر رفت)",
          formula: "حباب {f}", idle: "سهم بیکاری در نمودار",
          held: "بیشترین شمار میکرودسته‌هایی که فعال‌سازی‌هایشان هم‌زمان در یک مرحله می‌ماند",
          chart: "نمودار گانت: هر سطر یک مرحله، زمان به سمت راست" },
  };
  const WIDTH = 720;
  const ROW = 26;
  const LABEL = 70;

  const draw = (events, stages, lang) => {
    const t = TEXT[lang];
    const span = Math.max(...events.map((e) => e[4]));
    const unit = (WIDTH - LABEL - 4) / span;
    const svg = svgElement("svg", { viewBox: `0 0 ${WIDTH} ${stages * ROW + 4}`, role: "img",
                                    "aria-label": t.chart, class: "explorer__chart explorer__chart--wide" });
    for (let s = 0; s < stages; s += 1) {
      svg.append(svgElement("text", { x: LABEL - 6, y: s * ROW + ROW / 2 + 6, "text-anchor": "end",
                                      class: "explorer__label" }, `${t.stage} ${digits(s, lang)}`));
    }
    for (const [stage, micro, kind, start, end] of events) {
      const x = LABEL + start * unit;
      const width = (end - start) * unit;
      svg.append(svgElement("rect", { x, y: stage * ROW + 3, width: width - 1, height: ROW - 6,
                                      class: `explorer__box explorer__box--${kind}` }));
      if (unit >= 12) {
        svg.append(svgElement("text", { x: x + width / 2, y: stage * ROW + ROW / 2 + 5,
                                        "text-anchor": "middle", class: `explorer__micro explorer__micro--${kind}` },
                              digits(micro, lang)));
      }
    }
    return svg;
  };

  const build = (host, lang) => {
    const t = TEXT[lang];
    const schedule = select("schedule", [["gpipe", "GPipe"], ["1f1b", "1F1B"]], "1f1b");
    const stages = slider("stages", 2, 8, 4, lang);
    const micro = slider("micro_batches", 1, 16, 8, lang);
    const figure = element("div", { className: "explorer__figure", dir: "ltr" });
    const facts = element("dl", { className: "explorer__facts" });
    const legend = element("p", { className: "explorer__legend" },
      element("span", { className: "explorer__swatch explorer__swatch--F" }), ` ${t.forward}  `,
      element("span", { className: "explorer__swatch explorer__swatch--B" }), ` ${t.backward}`);
    const update = () => {
      const p = Number(stages.input.value);
      const m = Number(micro.input.value);
      const events = timeline(schedule.value, p, m);
      figure.replaceChildren(draw(events, p, lang));
      const peaks = [...Array(p).keys()].map((s) => peak(order(schedule.value, s, p, m)));
      facts.replaceChildren(
        ...fact(sentence(t.formula, { f: "(P − 1)/(m + P − 1)" }, ["f"]), format(theoretical(p, m), lang, 3), "formula"),
        ...fact(t.idle, format(bubble(events, p), lang, 3), "idle"),
        ...fact(t.held, peaks.map((n, s) => `${t.stage} ${digits(s, lang)}: ${digits(n, lang)}`)
          .join(lang === "fa" ? "، " : ", "), "peaks"));
    };
    for (const control of [schedule, stages.input, micro.input]) control.addEventListener("input", update);
    host.append(element("p", { className: "explorer__title" }, t.title),
                element("div", { className: "explorer__controls" }, labelled(t.schedule, schedule),
                        stages.wrap(t.stages), micro.wrap(t.micro)),
                figure, legend, facts);
    update();
  };

  globalThis.Explorer79 = { order, timeline, bubble, theoretical, peak };
  mount("79", build);
})();

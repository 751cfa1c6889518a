/*
 * Lesson 77's explorer: one backward pass of bucketed DDP, each bucket's all-reduce starting when
 * the bucket is full, for a bucket size and a link speed of your choice. The same model as
 * lesson_code.ddp_lab.overlap_model (tests/book/test_explorers.py compares them on a grid):
 * `groups` is ddp.bucket_groups, `overlap` overlap_model. The gradients' sizes, the stored
 * backward time, the ring's alpha and beta and the measured waits come from the book's stored
 * benchmarks, written into the page by the book's build (lesson_code.book_build.explorer_data).
 */
(() => {
  "use strict";
  const { digits, format, element, svgElement, labelled, select, fact, measuredNote, chartWidth,
          mount } = globalThis.CourseExplorers;

  const groups = (sizes, capBytes) => {
    const found = [];
    let current = [];
    let size = 0;
    sizes.forEach((nbytes, index) => {
      if (current.length && size + nbytes > capBytes) {
        found.push(current);
        current = [];
        size = 0;
      }
      current.push(index);
      size += nbytes;
    });
    if (current.length) found.push(current);
    return found;
  };

  const ringSeconds = (nbytes, n, alpha, beta) => 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta;

  const overlap = (sizes, bucketMb, backward, alpha, beta, n) => {
    const total = sizes.reduce((a, b) => a + b, 0);
    let done = 0;
    const readyAt = sizes.map((nbytes) => { done += nbytes; return backward * done / total; });
    let previousEnd = 0;
    const buckets = groups(sizes, Math.trunc(bucketMb * 2 ** 20)).map((group) => {
      const nbytes = group.reduce((sum, index) => sum + sizes[index], 0);
      const ready = readyAt[group[group.length - 1]];
      const start = Math.max(ready, previousEnd);
      previousEnd = start + ringSeconds(nbytes, n, alpha, beta);
      return { bytes: nbytes, ready, start, end: previousEnd };
    });
    return { buckets, backward_s: backward, exposed_s: Math.max(0, previousEnd - backward) };
  };

  const BUCKETS = [0.25, 0.5, 1, 2, 4, 8, 16, 32];
  const SPEEDS = [1, 4, 16, 100];
  const TEXT = {
    en: { title: "Buckets and overlap in one backward pass", bucket: "Bucket size (MB)", speed: "Link speed",
          measuredLink: "as measured", times: "× faster", backward: "backward", comm: "all-reduces",
          buckets: "Buckets", exposed: "Communication left after the backward (the model)",
          measured: "Measured wait at this bucket size (stored benchmark, 4 ranks on 2 cores)",
          none: "not measured at this size", chart: "Timeline: the backward pass, then each bucket's all-reduce",
          note: "Gradients are ready as the backward reaches them, in proportion to their bytes; each all-reduce takes the ring's alpha–beta time with the α and β fitted to the book's stored times. The model gives communication a link of its own: on a CPU the backward also needs those cores, so the measured wait is longer. Measured on {date} on: " },
    fa: { title: "باکت‌ها و هم‌پوشانی در یک گذر برگشت", bucket: "اندازهٔ باکت (مگابایت)", speed: "سرعت پیوند",
          measuredLink: "همان اندازه‌گیری‌شده", times: "× سریع‌تر", backward: "گذر برگشت", comm: "کاهش‌های همگانی",
          buckets: "تعداد باکت‌ها", exposed: "ارتباطی که پس از گذر برگشت می‌ماند (مدل)",
          measured: "انتظار اندازه‌گیری‌شده با این اندازهٔ باکت (محک ذخیره‌شده، ۴ رتبه روی ۲ هسته)",
          none: "با این اندازه اندازه‌گیری نشده است", chart: "خط زمانی: گذر برگشت، سپس کاهش همگانی هر باکت",
          note: "گرادیان‌ها به نسبت بایت‌هایشان، همان‌جا که گذر برگشت به آن‌ها می‌رسد، آماده می‌شوند؛ هر کاهش همگانی زمانِ مدل آلفا–بتای حلقه را با α و β برازش‌شده به زمان‌های ذخیره‌شدهٔ کتاب می‌گیرد. مدل برای ارتباط پیوندی جدا فرض می‌کند: روی CPU گذر برگشت هم همان هسته‌ها را می‌خواهد، پس انتظار اندازه‌گیری‌شده بیشتر است. اندازه‌گیری‌شده در {date} روی: " },
  };

  const timeline = (model, lang, width) => {
    const t = TEXT[lang];
    const end = Math.max(model.backward_s, ...model.buckets.map((b) => b.end));
    const left = 110;
    const x = (s) => left + (s / end) * (width - left - 10);
    const svg = svgElement("svg", { viewBox: `0 0 ${width} 96`, role: "img", "aria-label": t.chart,
                                    class: "explorer__chart" });
    svg.append(svgElement("text", { x: left - 8, y: 26, "text-anchor": "end", class: "explorer__label" }, t.backward));
    svg.append(svgElement("text", { x: left - 8, y: 62, "text-anchor": "end", class: "explorer__label" }, t.comm));
    let from = 0;
    model.buckets.forEach((bucket, index) => {
      svg.append(svgElement("rect", { x: x(from), y: 10, width: Math.max(x(bucket.ready) - x(from) - 0.5, 0.5),
                                      height: 24, class: `explorer__box explorer__box--${index % 2 ? "F" : "B"}` }));
      svg.append(svgElement("rect", { x: x(bucket.start), y: 46, width: Math.max(x(bucket.end) - x(bucket.start) - 0.5, 0.5),
                                      height: 24, class: `explorer__box explorer__box--${index % 2 ? "F" : "B"}` }));
      from = bucket.ready;
    });
    svg.append(svgElement("line", { x1: x(model.backward_s), x2: x(model.backward_s), y1: 4, y2: 78,
                                    class: "explorer__rollback" }));
    svg.append(svgElement("text", { x: x(end), y: 92, "text-anchor": "end", class: "explorer__label" },
                          `${format(end * 1e3, lang, 0)} ms`));
    return svg;
  };

  const build = (host, lang) => {
    const t = TEXT[lang];
    const data = JSON.parse(document.getElementById("explorer-data").textContent);
    const bucket = select("bucket_mb", BUCKETS.map((mb) => [String(mb), digits(mb, lang)]), "4");
    const speed = select("speed", SPEEDS.map((f) => [String(f), f === 1 ? t.measuredLink : `${digits(f, lang)}${t.times}`]), "1");
    const figure = element("div", { className: "explorer__figure", dir: "ltr" });
    const facts = element("dl", { className: "explorer__facts" });
    const update = () => {
      const mb = Number(bucket.value);
      const model = overlap(data.sizes, mb, data.backward_s, data.alpha, data.beta / Number(speed.value), data.world_size);
      figure.replaceChildren(timeline(model, lang, chartWidth(figure)));
      const measured = Number(speed.value) === 1 ? data.measured_wait_ms[String(mb)] : undefined;
      facts.replaceChildren(...fact(t.buckets, digits(model.buckets.length, lang), "buckets"),
        ...fact(t.exposed, `${format(model.exposed_s * 1e3, lang, 1)} ms`, "exposed"),
        ...fact(t.measured, measured === undefined ? t.none : `${format(measured, lang, 1)} ms`, "measured"));
    };
    for (const control of [bucket, speed]) control.addEventListener("input", update);
    host.append(element("p", { className: "explorer__title" }, t.title),
                element("div", { className: "explorer__controls" }, labelled(t.bucket, bucket), labelled(t.speed, speed)),
                figure, facts, measuredNote(t.note, data.measured, lang));
    update();
  };

  globalThis.Explorer77 = { groups, overlap };
  mount("77", build);
})();

/*
 * Lesson 77's explorer: one backward pass of bucketed DDP, each bucket's all-reduce starting when
 * the bucket is full, for a bucket size and a link speed of your choice, on this machine (the
 * model's inputs measured, the measured wait and step beside it) or on a modelled GPU cluster.
 * The same model as lesson_code.ddp_lab.overlap_model (tests/book/test_explorers.py compares
 * them on a grid): `groups` is ddp.bucket_groups, `overlap` overlap_model, `ratio`
 * ddp_lab.communication_ratio. The gradients' sizes, the backward's work before each, the
 * backward times, alpha and beta, and the measured waits and steps come from the book's stored
 * benchmarks and ddp_lab.ModelledCluster, written into the page by the book's build
 * (lesson_code.book_build.explorer_data).
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

  const overlap = (sizes, work, bucketMb, backward, alpha, beta, n) => {
    const shares = work || sizes;
    const total = shares.reduce((a, b) => a + b, 0);
    let done = 0;
    const readyAt = shares.map((amount) => { done += amount; return backward * done / total; });
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

  const ratio = (sizes, backward, alpha, beta, n) =>
    ringSeconds(sizes.reduce((a, b) => a + b, 0), n, alpha, beta) / backward;

  const BUCKETS = [0.25, 0.5, 1, 2, 4, 8, 16, 25, 32, 64, 128, 256, 1024];
  const SPEEDS = [1, 4, 16, 100];
  const TEXT = {
    en: { title: "Buckets and overlap in one backward pass", setting: "Setting", bucket: "Bucket size (MiB)",
          speed: "Link speed", measuredLink: "as in the setting", times: "× faster", backward: "backward", comm: "all-reduces",
          here: "this machine (measured inputs)", cluster: "a GPU cluster (modelled)",
          buckets: "Buckets", ratio: "All-reduce of every gradient at once ÷ backward (the model; above 1, no bucket size hides it all)",
          exposed: "Exposed communication, E (the model)",
          total: "Backward plus that communication (the model)",
          measured: "Measured wait at this bucket size (stored benchmark, 4 ranks on 2 cores)",
          step: "Measured step at this bucket size (the same benchmark)",
          none: "not measured at this setting", chart: "Timeline: the backward pass, then each bucket's all-reduce",
          note: "A gradient is ready once the backward has done the floating-point operations that come before it (a matrix's share is its matmuls; an embedding's backward is a scatter-add and adds almost nothing); each all-reduce takes the ring's alpha–beta time, and the backward runs as fast as it does alone. This machine: the benchmark's MiniGPT, the backward of its one-bucket row and the α and β fitted to the book's stored all-reduce times; here the all-reduces took cores from the backward, so the measured step is the figure of merit. Measured on {date} on: ",
          clusterNote: "Modelled, nothing measured: a MiniGPT of GPT-2 small's shape (float32 gradients) on 4 GPUs, one per node (every step of the ring crosses the network), one 200 Gb/s InfiniBand link each (1/β = 25 GB/s, α = 15 µs per step of the ring, from NCCL's tuning model), and a backward of its floating-point operations (8 sequences of 1024 tokens per GPU) at 125 TFLOP/s: lesson_code.ddp_lab.ModelledCluster." },
    fa: { title: "باکت‌ها و هم‌پوشانی در یک گذر برگشت", setting: "حالت", bucket: "اندازهٔ باکت (MiB)",
          speed: "سرعت پیوند", measuredLink: "همان حالتِ انتخاب‌شده", times: "× سریع‌تر", backward: "گذر برگشت", comm: "کاهش‌های همگانی",
          here: "این دستگاه (ورودی‌های اندازه‌گیری‌شده)", cluster: "یک خوشهٔ GPU (مدل‌شده)",
          buckets: "تعداد باکت‌ها", ratio: "کاهش همگانی همهٔ گرادیان‌ها با هم ÷ گذر برگشت (مدل؛ اگر از ۱ بیشتر باشد، هیچ اندازهٔ باکتی همه را پنهان نمی‌کند)",
          exposed: "ارتباط پنهان‌نشده، E (مدل)",
          total: "گذر برگشت به‌اضافهٔ همین ارتباط (مدل)",
          measured: "انتظار اندازه‌گیری‌شده با این اندازهٔ باکت (محک ذخیره‌شده، ۴ رتبه روی ۲ هسته)",
          step: "گام اندازه‌گیری‌شده با این اندازهٔ باکت (همان محک)",
          none: "در این حالت اندازه‌گیری نشده است", chart: "خط زمانی: گذر برگشت، سپس کاهش همگانی هر باکت",
          note: "هر گرادیان وقتی آماده است که گذر برگشت عملیات ممیز شناورِ پیش از آن را انجام داده باشد (سهم هر ماتریس ضرب‌های ماتریسی آن است؛ گذر برگشت جاسازی یک جمعِ پراکنده است و تقریباً چیزی نمی‌افزاید)؛ هر کاهش همگانی زمانِ مدل آلفا–بتای حلقه را می‌گیرد، و گذر برگشت همان‌قدر سریع اجرا می‌شود که به‌تنهایی. این دستگاه: MiniGPT محک، گذر برگشتِ سطر تک‌باکتی آن، و α و β برازش‌شده به زمان‌های ذخیره‌شدهٔ کاهش همگانی در کتاب؛ اینجا کاهش‌های همگانی هسته‌ها را از گذر برگشت گرفتند، پس معیار سنجش گامِ اندازه‌گیری‌شده است. اندازه‌گیری‌شده در {date} روی: ",
          clusterNote: "مدل‌شده، بی هیچ اندازه‌گیری: یک MiniGPT به شکل GPT-2 کوچک (گرادیان‌های float32) روی ۴ GPU، هر کدام در یک گره (هر گام حلقه از شبکه می‌گذرد) و با یک پیوند InfiniBand با سرعت ۲۰۰ گیگابیت بر ثانیه (پهنای باند ۲۵ GB/s، و تأخیر α برابر ۱۵ µs برای هر گام حلقه، از مدل تنظیم NCCL)، و گذر برگشتی به اندازهٔ عملیات ممیز شناورِ خودش (۸ دنباله با ۱۰۲۴ توکن برای هر GPU) با سرعت ۱۲۵ TFLOP/s؛ ثابت‌ها در lesson_code.ddp_lab.ModelledCluster." },
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
    const setting = select("setting", [["here", t.here], ["cluster", t.cluster]], "here");
    const bucket = select("bucket_mb", BUCKETS.map((mb) => [String(mb), digits(mb, lang)]), "4");
    const speed = select("speed", SPEEDS.map((f) => [String(f), f === 1 ? t.measuredLink : `${digits(f, lang)}${t.times}`]), "1");
    const figure = element("div", { className: "explorer__figure", dir: "ltr" });
    const facts = element("dl", { className: "explorer__facts" });
    const note = element("div");
    const ms = (seconds) => `${format(seconds * 1e3, lang, 1)} ms`;
    const update = () => {
      const mb = Number(bucket.value);
      const here = setting.value === "here";
      const inputs = here ? data : data.cluster;
      const beta = inputs.beta / Number(speed.value);
      const model = overlap(inputs.sizes, inputs.work, mb, inputs.backward_s, inputs.alpha, beta, inputs.world_size);
      figure.replaceChildren(timeline(model, lang, chartWidth(figure)));
      const asMeasured = here && Number(speed.value) === 1;
      const measured = (table) => (asMeasured && table[String(mb)] !== undefined ? `${format(table[String(mb)], lang, 1)} ms` : t.none);
      facts.replaceChildren(...fact(t.buckets, digits(model.buckets.length, lang), "buckets"),
        ...fact(t.ratio, format(ratio(inputs.sizes, inputs.backward_s, inputs.alpha, beta, inputs.world_size), lang, 2), "ratio"),
        ...fact(t.exposed, ms(model.exposed_s), "exposed"),
        ...fact(t.total, ms(model.backward_s + model.exposed_s), "total"),
        ...fact(t.measured, measured(data.measured_wait_ms), "measured"),
        ...fact(t.step, measured(data.measured_step_ms), "step"));
      note.replaceChildren(here ? measuredNote(t.note, data.measured, lang)
                                : element("p", { className: "explorer__note" }, t.clusterNote));
    };
    for (const control of [setting, bucket, speed]) control.addEventListener("input", update);
    host.append(element("p", { className: "explorer__title" }, t.title),
                element("div", { className: "explorer__controls" }, labelled(t.setting, setting),
                            labelled(t.bucket, bucket), labelled(t.speed, speed)),
                figure, facts, note);
    update();
  };

  globalThis.Explorer77 = { groups, overlap, ratio };
  mount("77", build);
})();

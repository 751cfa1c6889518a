/*
 * Lesson 80's explorer: a sharded save of step 2 over a checkpoint of step 1, crashed at any
 * moment. `events` is the order of lesson_code.checkpoint's save (shards.save_sharded,
 * staging.seal and publish), `stateAfter` the folder a crash after event k leaves, and
 * `latestAfter` what checkpoint.tools.latest_checkpoint loads from it. tests/book/test_explorers.py
 * replays a real save (checkpoint.faults.states_of_a_save) and asks latest_checkpoint about every
 * state, so the page and the package cannot drift apart.
 */
(() => {
  "use strict";
  const { digits, element, slider, sentence, fact, stepButtons, mount } = globalThis.CourseExplorers;
  const pad = (n, width) => String(n).padStart(width, "0");
  const shard = (rank, n) => `shard-${pad(rank, 5)}-of-${pad(n, 5)}.pt`;
  const OLD = "step-00000001";
  const NEW = "step-00000002";
  const TMP = ".step-00000002.tmp";

  /* Every change a save of step 2 makes to the folder, in order: {rank, action, name}. */
  const events = (n) => [
    { rank: 0, action: "stage", name: TMP },
    { rank: 0, action: "write", name: ".owner" },
    ...[...Array(n).keys()].map((rank) => ({ rank, action: "write", name: shard(rank, n) })),
    { rank: 0, action: "remove", name: ".owner" },
    { rank: 0, action: "write", name: "replicated.pt" },
    { rank: 0, action: "write", name: "manifest.json" },
    { rank: 0, action: "write", name: "manifest.sha256" },
    { rank: 0, action: "publish", name: NEW },
  ];

  const complete = (folder, n) => [`${folder}/`, ...["manifest.json", "manifest.sha256",
    "replicated.pt", ...[...Array(n).keys()].map((r) => shard(r, n))].map((f) => `${folder}/${f}`)];

  /* The files and folders ("name/") under the root once the first k events have run. */
  const stateAfter = (n, k) => {
    let staged = null;
    let published = false;
    for (const event of events(n).slice(0, k)) {
      if (event.action === "stage") staged = new Set();
      else if (event.action === "write") staged.add(event.name);
      else if (event.action === "remove") staged.delete(event.name);
      else published = true;
    }
    const paths = complete(OLD, n);
    if (published) paths.push(...complete(NEW, n));
    else if (staged) paths.push(`${TMP}/`, ...[...staged].map((f) => `${TMP}/${f}`));
    return paths.sort();
  };

  /* What latest_checkpoint returns after event k: the folder, and why a newer one was skipped. */
  const latestAfter = (n, k) => {
    const state = new Set(stateAfter(n, k));
    if (state.has(`${NEW}/`)) return { folder: NEW, skipped: null, publishes: false };
    if (!state.has(`${TMP}/`)) return { folder: OLD, skipped: null, publishes: false };
    if (state.has(`${TMP}/manifest.sha256`)) return { folder: NEW, skipped: null, publishes: true };
    return { folder: OLD, skipped: state.has(`${TMP}/manifest.json`) ? "checksum" : "interrupted",
             publishes: false };
  };

  const TEXT = {
    en: { title: "A crash at any moment of a sharded save", ranks: "Ranks N", crash: "Crash after event",
          previous: "Earlier", next: "Later",
          rank: "rank {r}", stage: "creates the hidden folder {name}", write: "writes {name} (a temporary name, fsync, rename)",
          remove: "removes {name}", publish: "renames the hidden folder to {name}: the checkpoint is published",
          disk: "On disk after the crash", loads: "latest_checkpoint loads",
          why: { none: "The save of step 2 had not begun; step 1 is whole.",
                 interrupted: "{tmp} has no manifest: an interrupted save, never published. It is skipped, and step 1 is untouched.",
                 checksum: "{tmp} has manifest.json but not yet its checksum, the last file a save writes: an interrupted save, never published. It is skipped, and step 1 is untouched.",
                 publishes: "Every file of {tmp} is there and verifies (the checksum was written last): latest_checkpoint publishes it and loads step 2.",
                 published: "Step 2 is published; step 1 is still there too." } },
    fa: { title: "از کار افتادن در هر لحظهٔ یک ذخیرهٔ شاردشده", ranks: "تعداد رتبه‌ها N", crash: "از کار افتادن پس از رویداد",
          previous: "زودتر", next: "دیرتر",
          rank: "رتبهٔ {r}", stage: "پوشهٔ پنهان {name} را می‌سازد", write: "{name} را می‌نویسد (با نام موقت، fsync، تغییر نام)",
          remove: "{name} را پاک می‌کند", publish: "نام پوشهٔ پنهان را به {name} تغییر می‌دهد: چکپوینت منتشر شد",
          disk: "آنچه پس از یک از کارافتادگی روی دیسک می‌ماند", loads: "latest_checkpoint بارگذاری می‌کند",
          why: { none: "ذخیرهٔ گام ۲ هنوز شروع نشده بود؛ گام ۱ کامل است.",
                 interrupted: "{tmp} مانیفست ندارد: ذخیره‌ای نیمه‌کاره که هرگز منتشر نشد. کنار گذاشته می‌شود و گام ۱ دست‌نخورده است.",
                 checksum: "{tmp} فایل manifest.json را دارد ولی هنوز چکیده‌اش را، آخرین فایلی که ذخیره می‌نویسد، نه: ذخیره‌ای نیمه‌کاره که هرگز منتشر نشد. کنار گذاشته می‌شود و گام ۱ دست‌نخورده است.",
                 publishes: "همهٔ فایل‌های {tmp} هستند و از وارسی سالم بیرون می‌آیند (چکیده آخر از همه نوشته شد): latest_checkpoint آن را منتشر و گام ۲ را بارگذاری می‌کند.",
                 published: "گام ۲ منتشر شده است؛ گام ۱ هم هنوز هست." } },
  };

  const build = (host, lang) => {
    const t = TEXT[lang];
    const ranks = slider("world_size", 1, 8, 2, lang);
    const crash = slider("crash_after", 0, 9, 4, lang);
    const list = element("ol", { className: "explorer__events" });
    const disk = element("pre", { className: "explorer__tree", dir: "ltr" });
    const facts = element("dl", { className: "explorer__facts" });
    const update = () => {
      const n = Number(ranks.input.value);
      const all = events(n);
      crash.input.max = all.length;
      if (Number(crash.input.value) > all.length) crash.input.value = all.length;
      crash.shown.textContent = digits(crash.input.value, lang);
      const k = Number(crash.input.value);
      list.replaceChildren(...all.map((event, index) => {
        const item = element("li", {}, `${t.rank.replace("{r}", digits(event.rank, lang))}: `,
          ...sentence(t[event.action], { name: event.name }, ["name"]));
        item.dataset.state = index < k ? "done" : "pending";
        if (index === k - 1) item.dataset.state = "last";
        return item;
      }));
      disk.textContent = stateAfter(n, k).join("\n");
      const latest = latestAfter(n, k);
      const reason = k === 0 ? "none" : latest.skipped || (latest.publishes ? "publishes"
        : latest.folder === NEW ? "published" : "none");
      facts.replaceChildren(...fact(t.loads, [element("bdi", { dir: "ltr" }, latest.folder)], "latest"),
                            ...fact("↳", sentence(t.why[reason], { tmp: TMP }, ["tmp"]), "why"));
    };
    for (const control of [ranks.input, crash.input]) control.addEventListener("input", update);
    host.append(element("p", { className: "explorer__title" }, t.title),
                element("div", { className: "explorer__controls" }, ranks.wrap(t.ranks),
                        crash.wrap(t.crash), ...stepButtons(crash, t, update)),
                list, element("p", { className: "explorer__legend" }, t.disk), disk, facts);
    update();
  };

  globalThis.Explorer80 = { events, stateAfter, latestAfter };
  mount("80", build);
})();

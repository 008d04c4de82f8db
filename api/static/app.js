// tritium's chat page: no dependencies, no build step. Model text only ever reaches the page as
// text nodes (textContent / append(string)); the Markdown renderer builds elements itself.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const STORE = "tritium.conversations", SETTINGS = "tritium.settings", KEY = "tritium.apiKey";
  const DEFAULTS = { system: "", temperature: 0.8, max_tokens: -1 };

  const load = (k, d) => { try { const v = localStorage.getItem(k); return v ? JSON.parse(v) : d; } catch (e) { return d; } };
  let settings = Object.assign({}, DEFAULTS, load(SETTINGS, {}));
  let conversations = load(STORE, []);
  let currentId = conversations.length ? conversations[0].id : null;
  let controller = null;      // AbortController of the running generation
  let generatingIn = null;    // id of the conversation being generated into
  let modelName = "";
  let modalities = { vision: false, audio: false };  // what the server's --mmproj takes (GET /props)
  let attachments = [];       // files of the message being written: {kind: "image"|"audio", url, name}
  const save = () => {
    try { localStorage.setItem(STORE, JSON.stringify(conversations)); }
    catch (e) { $("status").textContent = "not saved: " + (e.message || e); }  // quota (large images)
  };
  const current = () => conversations.find((c) => c.id === currentId) || null;

  // ---------------------------------------------------------------- Markdown -> DOM
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([^\s`]*)/;
  const LIST = /^\s{0,3}([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const HEAD = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const QUOTE = /^\s{0,3}>\s?(.*)$/;
  const startsBlock = (l) => FENCE.test(l) || LIST.test(l) || HEAD.test(l) || QUOTE.test(l);

  function renderMarkdown(src, parent) {
    const lines = src.replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if ((m = line.match(FENCE))) {
        const marker = m[1], body = [];
        i++;
        while (i < lines.length && !lines[i].trim().startsWith(marker)) body.push(lines[i++]);
        i++; // the closing fence (absent while the block is still streaming)
        const pre = el("pre"), code = el("code", null, body.join("\n"));
        if (m[2]) code.dataset.lang = m[2];
        pre.append(code);
        parent.append(pre);
      } else if ((m = line.match(HEAD))) {
        const h = el("h" + Math.min(m[1].length + 1, 6));
        renderInline(m[2], h);
        parent.append(h);
        i++;
      } else if (QUOTE.test(line)) {
        const body = [];
        while (i < lines.length && (m = lines[i].match(QUOTE))) { body.push(m[1]); i++; }
        const q = el("blockquote");
        renderMarkdown(body.join("\n"), q);
        parent.append(q);
      } else if ((m = line.match(LIST))) {
        const ordered = /\d/.test(m[1]);
        const list = el(ordered ? "ol" : "ul");
        if (ordered && parseInt(m[1], 10) !== 1) list.start = parseInt(m[1], 10);
        while (i < lines.length && (m = lines[i].match(LIST)) && /\d/.test(m[1]) === ordered) {
          const li = el("li");
          renderInline(m[2], li);
          list.append(li);
          i++;
          while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !LIST.test(lines[i])) {
            li.append(el("br"));
            renderInline(lines[i++].trim(), li);
          }
        }
        parent.append(list);
      } else if (!line.trim()) {
        i++;
      } else {
        const p = el("p");
        let first = true;
        while (i < lines.length && lines[i].trim() && !(startsBlock(lines[i]) && !first)) {
          if (!first) p.append(el("br"));
          renderInline(lines[i++], p);
          first = false;
        }
        parent.append(p);
      }
    }
  }

  const INLINE = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]*?\S)\*\*|\*(?=[^\s*])([^*]*?[^\s*])\*|\[([^\]]+)\]\(([^)\s]+)\)/g;

  function renderInline(text, parent) {
    let last = 0, m;
    INLINE.lastIndex = 0;
    const matches = [];
    while ((m = INLINE.exec(text))) matches.push([m.index, INLINE.lastIndex, m.slice()]);
    for (const [start, end, g] of matches) {
      if (start > last) parent.append(text.slice(last, start));
      if (g[1]) {
        parent.append(el("code", null, g[2]));
      } else if (g[3] !== undefined) {
        const b = el("strong"); renderInline(g[3], b); parent.append(b);
      } else if (g[4] !== undefined) {
        const e = el("em"); renderInline(g[4], e); parent.append(e);
      } else if (/^https?:\/\//i.test(g[6])) {
        const a = el("a", null, g[5]);
        a.href = g[6]; a.target = "_blank"; a.rel = "noopener noreferrer";
        parent.append(a);
      } else {
        parent.append(g[0]);
      }
      last = end;
    }
    if (last < text.length) parent.append(text.slice(last));
  }

  // ---------------------------------------------------------------- HTTP
  function askApiKey() {
    return new Promise((resolve) => {
      const d = $("api-key-dialog");
      $("api-key-input").value = "";
      d.addEventListener("close", () => {
        const key = d.returnValue === "save" ? $("api-key-input").value.trim() : "";
        if (key) localStorage.setItem(KEY, key);
        resolve(key);
      }, { once: true });
      if (!d.open) d.showModal();
    });
  }

  async function api(path, opts = {}) {
    const headers = Object.assign({ "Content-Type": "application/json" }, opts.headers || {});
    const key = localStorage.getItem(KEY);
    if (key) headers.Authorization = "Bearer " + key;
    const r = await fetch(path, Object.assign({}, opts, { headers }));
    if (r.status === 401) {
      if (await askApiKey()) return api(path, opts);
      throw new Error("Invalid API Key");
    }
    return r;
  }

  async function errorText(r) {
    try { const j = await r.json(); return (j.error && j.error.message) || r.statusText; } catch (e) { return r.statusText; }
  }

  async function loadModel() {
    try {
      const r = await api("v1/models");
      if (r.status === 503) { $("status").textContent = "loading model…"; setTimeout(loadModel, 1000); return; }
      if (!r.ok) { $("status").textContent = await errorText(r); return; }
      const j = await r.json();
      modelName = (j.data && j.data[0] && j.data[0].id) || "";
      $("model-name").textContent = modelName.split(/[\\/]/).pop() || "model";
      $("model-name").title = modelName;
      if ($("status").textContent === "loading model…") $("status").textContent = "";
      const p = await api("props");
      if (p.ok) modalities = Object.assign({ vision: false, audio: false }, (await p.json()).modalities || {});
      renderAttachments();
    } catch (e) {
      $("status").textContent = String(e.message || e);
    }
  }

  // ---------------------------------------------------------------- attachments (images, audio)
  // only data: URLs of the kinds the server takes are kept and shown (never a remote URL)
  const isImageUrl = (u) => typeof u === "string" && u.startsWith("data:image/");
  const isAudioUrl = (u) => typeof u === "string" && u.startsWith("data:audio/");

  function accepts(file) {
    return (modalities.vision && file.type.startsWith("image/")) || (modalities.audio && file.type.startsWith("audio/"));
  }

  function addFiles(files) {
    for (const f of files) {
      if (!accepts(f)) {
        $("status").textContent = f.type.startsWith("image/") || f.type.startsWith("audio/")
          ? "this model takes no " + f.type.split("/")[0] + " input" : "not an image: " + (f.name || f.type);
        continue;
      }
      const r = new FileReader();
      r.onload = () => {
        attachments.push({ kind: f.type.startsWith("image/") ? "image" : "audio", url: String(r.result), name: f.name || "" });
        renderAttachments();
      };
      r.readAsDataURL(f);
    }
  }

  function renderAttachments() {
    const box = $("attachments");
    box.replaceChildren();
    attachments.forEach((a, i) => {
      const item = el("div", "attachment");
      if (a.kind === "image" && isImageUrl(a.url)) { const img = el("img"); img.src = a.url; img.alt = a.name; item.append(img); }
      else item.append(el("span", null, a.name || a.kind));
      const x = el("button", "remove", "×");
      x.type = "button"; x.title = "remove";
      x.addEventListener("click", () => { attachments.splice(i, 1); renderAttachments(); });
      item.append(x);
      box.append(item);
    });
    box.hidden = !attachments.length;
    $("attach").hidden = !(modalities.vision || modalities.audio);
    $("file").accept = [modalities.vision ? "image/*" : "", modalities.audio ? "audio/*" : ""].filter(Boolean).join(",");
  }

  // content parts of a user message (OpenAI's: text, image_url, input_audio)
  function userContent(m) {
    const media = (m.media || []).filter((a) => isImageUrl(a.url) || isAudioUrl(a.url));
    if (!media.length) return m.content;
    const parts = media.map((a) => a.kind === "image"
      ? { type: "image_url", image_url: { url: a.url } }
      : { type: "input_audio", input_audio: { data: a.url.slice(a.url.indexOf(",") + 1),
                                              format: (a.url.match(/^data:audio\/(?:x-)?(\w+)/) || [])[1] || "wav" } });
    if (m.content) parts.push({ type: "text", text: m.content });
    return parts;
  }

  // ---------------------------------------------------------------- conversations
  function newConversation() {
    const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New conversation", messages: [] };
    conversations.unshift(c);
    currentId = c.id;
    save();
    renderAll();
    $("input").focus();
    return c;
  }

  function renderList() {
    const ul = $("conversations");
    ul.replaceChildren();
    for (const c of conversations) {
      const li = el("li", c.id === currentId ? "active" : "");
      li.dataset.id = c.id;
      li.append(el("span", null, c.title));
      const del = el("button", "delete", "×");
      del.type = "button"; del.title = "delete";
      del.addEventListener("click", (ev) => {
        ev.stopPropagation();
        if (generatingIn === c.id) stop();
        conversations = conversations.filter((x) => x.id !== c.id);
        if (currentId === c.id) currentId = conversations.length ? conversations[0].id : null;
        save(); renderAll();
      });
      li.append(del);
      li.addEventListener("click", () => { currentId = c.id; renderAll(); });
      ul.append(li);
    }
  }

  function renderMessage(m, index, conv) {
    const div = el("div", "msg " + m.role);
    div.dataset.state = m.state || "done";
    div.append(el("div", "role", m.role === "user" ? "You" : "Assistant"));
    if (m.role === "user") {
      for (const a of m.media || []) {
        if (a.kind === "image" && isImageUrl(a.url)) { const img = el("img", "media"); img.src = a.url; img.alt = a.name || ""; div.append(img); }
        else if (isAudioUrl(a.url)) div.append(el("div", "media", "🔊 " + (a.name || "audio")));
      }
      div.append(m.content);
      return div;
    }
    if (m.reasoning) {
      const d = el("details");
      d.append(el("summary", null, m.state === "streaming" && !m.content ? "Thinking…" : "Reasoning"));
      d.append(el("div", "reasoning", m.reasoning));
      div.append(d);
    }
    const content = el("div", "content");
    renderMarkdown(m.content || "", content);
    div.append(content);
    for (const tc of m.tool_calls || []) {
      div.append(el("div", "tool-call", "tool call: " + (tc.function.name || "") + "(" + (tc.function.arguments || "") + ")"));
    }
    if (m.error) div.append(el("div", "error", m.error));
    const meta = el("div", "meta");
    if (m.state === "stopped") meta.append(el("span", "stopped", "stopped"));
    if (m.n_tokens) meta.append(el("span", "tokens", m.n_tokens + " tokens" + (m.tps ? " · " + m.tps.toFixed(1) + " t/s" : "")));
    if (index === conv.messages.length - 1 && m.state !== "streaming" && !controller) {
      const regen = el("button", "regenerate", "Regenerate");
      regen.type = "button";
      regen.addEventListener("click", () => regenerate());
      meta.append(regen);
    }
    div.append(meta);
    return div;
  }

  function renderMessages() {
    const box = $("messages"), conv = current();
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    box.replaceChildren();
    if (conv) conv.messages.forEach((m, i) => box.append(renderMessage(m, i, conv)));
    if (atBottom) box.scrollTop = box.scrollHeight;
  }

  function renderAll() {
    renderList();
    renderMessages();
    const busy = controller !== null;
    $("send").hidden = busy;
    $("stop").hidden = !busy;
  }

  let frame = 0;
  const scheduleRender = () => { if (!frame) frame = requestAnimationFrame(() => { frame = 0; renderMessages(); }); };

  // ---------------------------------------------------------------- generation
  function requestMessages(conv) {
    const out = [];
    if (settings.system.trim()) out.push({ role: "system", content: settings.system });
    for (const m of conv.messages) {
      if (m.role === "user") out.push({ role: "user", content: userContent(m) });
      else if (m.content) out.push({ role: "assistant", content: m.content });
    }
    return out;
  }

  function applyChunk(msg, j) {
    if (j.error) { msg.error = j.error.message || JSON.stringify(j.error); return; }
    const ch = j.choices && j.choices[0];
    const delta = (ch && ch.delta) || {};
    if (delta.content) msg.content += delta.content;
    if (delta.reasoning_content) msg.reasoning = (msg.reasoning || "") + delta.reasoning_content;
    for (const tc of delta.tool_calls || []) {
      msg.tool_calls = msg.tool_calls || [];
      const t = msg.tool_calls[tc.index || 0] = msg.tool_calls[tc.index || 0] || { id: "", type: "function", function: { name: "", arguments: "" } };
      if (tc.id) t.id = tc.id;
      if (tc.function && tc.function.name) t.function.name += tc.function.name;
      if (tc.function && tc.function.arguments) t.function.arguments += tc.function.arguments;
    }
    if (j.usage) msg.n_tokens = j.usage.completion_tokens;
    if (j.timings) { msg.n_tokens = j.timings.predicted_n; msg.tps = j.timings.predicted_per_second; }
  }

  async function generate(conv) {
    const msg = { role: "assistant", content: "", state: "streaming" };
    conv.messages.push(msg);
    controller = new AbortController();
    generatingIn = conv.id;
    $("status").textContent = "generating…";
    renderAll();
    const body = { messages: requestMessages(conv), stream: true, temperature: Number(settings.temperature),
                   stream_options: { include_usage: true } };
    if (modelName) body.model = modelName;
    if (Number(settings.max_tokens) >= 0) body.max_tokens = Number(settings.max_tokens);
    try {
      const r = await api("v1/chat/completions", { method: "POST", body: JSON.stringify(body), signal: controller.signal });
      if (!r.ok) {
        msg.error = await errorText(r);
      } else {
        const reader = r.body.getReader(), dec = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let k;
          while ((k = buf.indexOf("\n\n")) >= 0) {
            const event = buf.slice(0, k);
            buf = buf.slice(k + 2);
            for (const line of event.split("\n")) {
              if (!line.startsWith("data:")) continue;
              const data = line.slice(5).trim();
              if (data === "[DONE]") continue;
              try { applyChunk(msg, JSON.parse(data)); } catch (e) { /* not JSON: ignored */ }
            }
          }
          scheduleRender();
        }
      }
      msg.state = "done";
    } catch (e) {
      if (e.name === "AbortError") msg.state = "stopped";
      else { msg.state = "done"; msg.error = String(e.message || e); }
    }
    controller = null;
    generatingIn = null;
    $("status").textContent = msg.n_tokens ? msg.n_tokens + " tokens" + (msg.tps ? ", " + msg.tps.toFixed(1) + " t/s" : "") : "";
    save();
    renderAll();
  }

  function stop() { if (controller) controller.abort(); }

  function send() {
    const text = $("input").value;
    if ((!text.trim() && !attachments.length) || controller) return;
    const conv = current() || newConversation();
    if (!conv.messages.length) conv.title = (text.trim() || attachments.map((a) => a.name || a.kind).join(", ")).slice(0, 40);
    const m = { role: "user", content: text };
    if (attachments.length) m.media = attachments;
    conv.messages.push(m);
    attachments = [];
    renderAttachments();
    $("input").value = "";
    save();
    generate(conv);
  }

  function regenerate() {
    const conv = current();
    if (!conv || controller) return;
    while (conv.messages.length && conv.messages[conv.messages.length - 1].role !== "user") conv.messages.pop();
    if (conv.messages.length) generate(conv);
  }

  // ---------------------------------------------------------------- settings
  function openSettings() {
    $("set-system").value = settings.system;
    $("set-temperature").value = settings.temperature;
    $("set-max-tokens").value = settings.max_tokens;
    $("set-api-key").value = localStorage.getItem(KEY) || "";
    $("settings").showModal();
  }

  $("settings").addEventListener("close", () => {
    if ($("settings").returnValue !== "save") return;
    const t = parseFloat($("set-temperature").value), n = parseInt($("set-max-tokens").value, 10);
    settings = { system: $("set-system").value, temperature: isNaN(t) ? DEFAULTS.temperature : t,
                 max_tokens: isNaN(n) ? DEFAULTS.max_tokens : n };
    localStorage.setItem(SETTINGS, JSON.stringify(settings));
    const key = $("set-api-key").value.trim();
    if (key) localStorage.setItem(KEY, key); else localStorage.removeItem(KEY);
  });

  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  $("stop").addEventListener("click", stop);
  $("attach").addEventListener("click", () => $("file").click());
  $("file").addEventListener("change", () => { addFiles($("file").files); $("file").value = ""; });
  $("input").addEventListener("paste", (e) => {
    const files = [...(e.clipboardData ? e.clipboardData.files : [])];
    if (files.length && (modalities.vision || modalities.audio)) { e.preventDefault(); addFiles(files); }
  });
  $("composer").addEventListener("dragover", (e) => { if (modalities.vision || modalities.audio) e.preventDefault(); });
  $("composer").addEventListener("drop", (e) => {
    if (!(modalities.vision || modalities.audio)) return;
    e.preventDefault();
    addFiles([...(e.dataTransfer ? e.dataTransfer.files : [])]);
  });
  $("new-chat").addEventListener("click", () => { if (!controller) newConversation(); });
  $("open-settings").addEventListener("click", openSettings);

  // a generation cut by a page reload stays as it was, marked stopped
  for (const c of conversations) for (const m of c.messages) if (m.state === "streaming") m.state = "stopped";
  renderAll();
  loadModel();
})();

// Octavo's built-in page: a chat playground streaming from /v1/chat/completions and a
// live view of the server drawn from /metrics (Prometheus text, parsed here). Plain
// JavaScript, no dependencies, no build step. With --api-key the page asks for the key
// once, keeps it in sessionStorage (this tab only) and sends it as a Bearer token.
"use strict";

const KEY_STORAGE = "octavo-api-key";
const query = new URLSearchParams(location.search);
const POLL_MS = Math.max(250, Number(query.get("poll")) || 3000);
const HISTORY_MS = 5 * 60 * 1000;
const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------- errors on the page

const errors = new Map(); // source ("auth", "metrics", "models", ...) -> message

function showError(source, message) {
  errors.set(source, message);
  renderErrors();
}

function clearError(source) {
  if (errors.delete(source)) renderErrors();
}

function renderErrors() {
  const box = $("error");
  box.textContent = [...errors.values()].join("\n");
  box.hidden = errors.size === 0;
}

// ---------------------------------------------------------------- API access

class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function authHeaders(extra = {}) {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { ...extra, Authorization: `Bearer ${key}` } : { ...extra };
}

async function errorText(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    const message = body.error?.message ?? body.detail ?? body.message ?? text;
    return `${response.status}: ${typeof message === "string" ? message : JSON.stringify(message)}`;
  } catch {
    return `${response.status}: ${text || response.statusText}`;
  }
}

// fetch with the key; a 401 asks for the key, any other failure throws a readable error.
async function api(path, options = {}) {
  let response;
  try {
    response = await fetch(path, { ...options, headers: authHeaders(options.headers) });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new Error(`Cannot reach the server (${err.message}).`);
  }
  if (response.status === 401) {
    askForKey();
    throw new HttpError(401, `${await errorText(response)} Enter the server's API key above.`);
  }
  if (!response.ok) throw new HttpError(response.status, await errorText(response));
  return response;
}

function askForKey() {
  const form = $("key-form");
  if (!form.hidden) return;
  form.hidden = false;
  $("key-input").focus();
}

function saveKey(event) {
  event.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_STORAGE, key);
  $("key-input").value = "";
  $("key-form").hidden = true;
  clearError("auth");
  loadModels();
}

// ---------------------------------------------------------------- models and adapters

async function loadModels() {
  try {
    const body = await (await api("/v1/models")).json();
    const select = $("model");
    const chosen = select.value;
    select.replaceChildren(
      ...body.data.map((card) => {
        const label = card.parent ? `${card.id} (adapter of ${card.parent})` : card.id;
        return new Option(label, card.id, false, card.id === chosen);
      }),
    );
    clearError("models");
  } catch (err) {
    showError(err.status === 401 ? "auth" : "models", `Models: ${err.message}`);
  }
}

// ---------------------------------------------------------------- chat

const history = []; // {role, content} of this conversation, without the system prompt
let running = null; // the AbortController of the request being streamed

function addMessage(role, text) {
  const element = document.createElement("div");
  element.className = `message ${role}`;
  element.textContent = text;
  $("messages").append(element);
  element.scrollIntoView({ block: "end" });
  return element;
}

function chatRequest() {
  const temperature = Number($("temperature").value);
  const maxTokens = Number($("max-tokens").value);
  if (!Number.isFinite(temperature) || temperature < 0) throw new Error("Temperature must be a number >= 0.");
  if (!Number.isInteger(maxTokens) || maxTokens < 1) throw new Error("Max tokens must be a whole number >= 1.");
  const system = $("system").value.trim();
  const messages = system ? [{ role: "system", content: system }, ...history] : [...history];
  return {
    model: $("model").value || undefined,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature,
    max_tokens: maxTokens,
  };
}

// Read an SSE body, calling onChunk for each JSON chunk until [DONE].
async function readEvents(response, onChunk) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("The stream ended before [DONE].");
    buffer += decoder.decode(value, { stream: true });
    const lines = buffer.split("\n");
    buffer = lines.pop();
    for (const line of lines) {
      if (!line.startsWith("data:")) continue;
      const payload = line.slice(5).trim();
      if (payload === "[DONE]") return;
      const chunk = JSON.parse(payload);
      if (chunk.error) throw new Error(`${chunk.error.code ?? ""} ${chunk.error.message}`.trim());
      onChunk(chunk);
    }
  }
}

function replyMeta(usage, started, firstToken) {
  const parts = [];
  const seconds = (performance.now() - started) / 1000;
  if (firstToken !== null) parts.push(`first token ${Math.round(firstToken - started)} ms`);
  if (usage) {
    parts.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} generated tokens`);
    parts.push(`${(usage.completion_tokens / seconds).toFixed(1)} tokens/s`);
  }
  return parts.join(" · ");
}

async function streamReply(request, bubble) {
  running = new AbortController();
  const started = performance.now();
  let firstToken = null;
  let usage = null;
  const response = await api("/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(request),
    signal: running.signal,
  });
  await readEvents(response, (chunk) => {
    if (chunk.usage) usage = chunk.usage;
    const delta = chunk.choices?.[0]?.delta ?? {};
    const text = (delta.reasoning_content ?? "") + (delta.content ?? "");
    if (!text) return;
    if (firstToken === null) firstToken = performance.now();
    bubble.textContent += text;
    bubble.scrollIntoView({ block: "end" });
  });
  return replyMeta(usage, started, firstToken);
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || running) return;
  let request;
  history.push({ role: "user", content: text });
  try {
    request = chatRequest();
  } catch (err) {
    history.pop();
    addMessage("error", err.message);
    return;
  }
  $("prompt").value = "";
  addMessage("user", text);
  const bubble = addMessage("assistant", "");
  bubble.dataset.state = "streaming";
  setBusy(true);
  try {
    const meta = await streamReply(request, bubble);
    history.push({ role: "assistant", content: bubble.textContent });
    bubble.dataset.state = "done";
    const line = document.createElement("span");
    line.className = "meta";
    line.textContent = meta;
    bubble.append(line);
  } catch (err) {
    history.pop();
    bubble.dataset.state = err.name === "AbortError" ? "stopped" : "failed";
    if (err.name !== "AbortError") addMessage("error", `Chat: ${err.message}`);
  } finally {
    running = null;
    setBusy(false);
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").hidden = !busy;
}

function newChat() {
  if (running) running.abort();
  history.length = 0;
  $("messages").replaceChildren();
}

// ---------------------------------------------------------------- /metrics

// Prometheus text -> Map(series name -> sum over its label sets).
function parsePrometheus(text) {
  const values = new Map();
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const brace = line.indexOf("{");
    let name;
    let rest;
    if (brace >= 0) {
      name = line.slice(0, brace);
      rest = line.slice(line.lastIndexOf("}") + 1);
    } else {
      [name, ...rest] = line.split(/\s+/);
      rest = rest.join(" ");
    }
    const field = rest.trim().split(/\s+/)[0];
    const value = field === "+Inf" ? Infinity : field === "-Inf" ? -Infinity : Number(field);
    values.set(name, (values.get(name) ?? 0) + value);
  }
  return values;
}

const samples = []; // {t, m: Map} of each poll, the last HISTORY_MS

function rate(a, b, name) {
  const seconds = (b.t - a.t) / 1000;
  if (!b.m.has(name) || seconds <= 0) return null;
  return Math.max(0, (b.m.get(name) - (a.m.get(name) ?? 0)) / seconds);
}

function ratio(a, b, numerator, denominator) {
  const over = (b.m.get(denominator) ?? 0) - (a.m.get(denominator) ?? 0);
  if (!(over > 0)) return null;
  return ((b.m.get(numerator) ?? 0) - (a.m.get(numerator) ?? 0)) / over;
}

function meanMs(a, b, histogram) {
  const mean = ratio(a, b, `${histogram}_sum`, `${histogram}_count`);
  return mean === null ? null : mean * 1000;
}

function gauge(b, name, scale = 1) {
  return b.m.has(name) ? b.m.get(name) * scale : null;
}

function total(b, name) {
  return b.m.get(name) ?? null;
}

// What each card shows: its value between two polls, and a running total where it has one.
const CARDS = [
  { id: "running", label: "Requests running", at: (a, b) => gauge(b, "vllm:num_requests_running"), digits: 0,
    total: (b) => total(b, "vllm:request_success_total"), totalLabel: "finished" },
  { id: "waiting", label: "Requests waiting", at: (a, b) => gauge(b, "vllm:num_requests_waiting"), digits: 0 },
  { id: "generation", label: "Generated tokens/s", at: (a, b) => rate(a, b, "vllm:generation_tokens_total"), digits: 1,
    total: (b) => total(b, "vllm:generation_tokens_total"), totalLabel: "generated" },
  { id: "prompt", label: "Prompt tokens/s", at: (a, b) => rate(a, b, "vllm:prompt_tokens_total"), digits: 1,
    total: (b) => total(b, "vllm:prompt_tokens_total"), totalLabel: "prompt tokens" },
  { id: "ttft", label: "Time to first token (ms)", at: (a, b) => meanMs(a, b, "vllm:time_to_first_token_seconds"), digits: 0 },
  { id: "itl", label: "Inter-token latency (ms)", at: (a, b) => meanMs(a, b, "vllm:inter_token_latency_seconds"), digits: 1 },
  { id: "kv", label: "KV cache used (%)", at: (a, b) => gauge(b, "vllm:kv_cache_usage_perc", 100), digits: 1 },
  { id: "prefix", label: "Prefix cache hit rate (%)", digits: 1,
    at: (a, b) => {
      const hits = ratio(a, b, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total");
      return hits === null ? null : hits * 100;
    } },
];

function buildCards() {
  $("cards").replaceChildren(
    ...CARDS.map((card) => {
      const element = document.createElement("div");
      element.className = "card";
      element.dataset.metric = card.id;
      element.innerHTML =
        '<div class="label"></div><div class="value">–</div><div class="total"></div>' +
        '<svg viewBox="0 0 200 40" preserveAspectRatio="none" aria-hidden="true">' +
        '<line class="base" x1="0" y1="39.5" x2="200" y2="39.5"></line><polyline points=""></polyline></svg>';
      element.querySelector(".label").textContent = card.label;
      return element;
    }),
  );
  $("poll-note").textContent = `every ${POLL_MS / 1000} s, the last ${HISTORY_MS / 60000} minutes`;
}

// SVG points of a card's line: time across (the history kept so far), 0..max upwards.
function sparkline(points, since, now) {
  const values = points.filter((p) => p.v !== null && Number.isFinite(p.v));
  const top = Math.max(1e-9, ...values.map((p) => p.v));
  const span = Math.max(1, now - since);
  return values
    .map((p) => {
      const x = (200 * (p.t - since)) / span;
      const y = 39 - (37 * p.v) / top;
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    })
    .join(" ");
}

function renderCards() {
  const now = samples[samples.length - 1].t;
  const since = samples[0].t;
  for (const card of CARDS) {
    const points = [];
    for (let i = 1; i < samples.length; i += 1) {
      points.push({ t: samples[i].t, v: card.at(samples[i - 1], samples[i]) });
    }
    const element = document.querySelector(`.card[data-metric="${card.id}"]`);
    // The latest value measured: latencies have none in a poll without new tokens.
    const latest = points.findLast((p) => p.v !== null)?.v ?? null;
    const value = element.querySelector(".value");
    value.textContent = latest === null ? "–" : latest.toFixed(card.digits);
    value.dataset.value = latest === null ? "" : String(latest);
    if (card.total) {
      const sum = card.total(samples[samples.length - 1]);
      const line = element.querySelector(".total");
      line.textContent = sum === null ? "" : `${Math.round(sum)} ${card.totalLabel}`;
      line.dataset.value = sum === null ? "" : String(sum);
    }
    element.querySelector("polyline").setAttribute("points", sparkline(points, since, now));
  }
}

async function pollMetrics() {
  try {
    const text = await (await api("/metrics")).text();
    const now = Date.now();
    samples.push({ t: now, m: parsePrometheus(text) });
    while (samples.length > 2 && samples[0].t < now - HISTORY_MS) samples.shift();
    renderCards();
    clearError("metrics");
  } catch (err) {
    showError(err.status === 401 ? "auth" : "metrics", `Metrics: ${err.message}`);
  }
}

async function pollHealth() {
  const pill = $("server-status");
  try {
    const response = await fetch("/health", { headers: authHeaders() });
    if (response.ok) {
      pill.dataset.state = "ok";
      pill.textContent = "ready";
      clearError("health");
      if (!$("model").options.length && $("key-form").hidden) loadModels();
      return;
    }
    pill.dataset.state = "loading";
    pill.textContent = "not ready";
    showError("health", `Health: ${await errorText(response)}`);
  } catch (err) {
    pill.dataset.state = "down";
    pill.textContent = "unreachable";
    showError("health", `Cannot reach the server (${err.message}).`);
  }
}

async function pollLoop() {
  await Promise.all([pollHealth(), pollMetrics()]);
  setTimeout(pollLoop, POLL_MS);
}

// ---------------------------------------------------------------- start

function start() {
  $("key-form").addEventListener("submit", saveKey);
  $("chat-form").addEventListener("submit", send);
  $("stop").addEventListener("click", () => running?.abort());
  $("clear").addEventListener("click", newChat);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("chat-form").requestSubmit();
    }
  });
  buildCards();
  loadModels();
  pollLoop();
}

start();

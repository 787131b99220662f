// An OpenAI-compatible stand-in for tests/benchmarks/bench_scale.py, in Node's plain `http`
// module so that it is far faster than the driver it measures. Not a model.
//
//   node standin_server.js PORT [SLOTS MEDIAN_S SIGMA SEED]
//
// POST /v1/chat/completions: a canned chat completion of about 2 KB, a judgement that wim's
// parser reads (JSON when the request asks for a response_format, else "Missing: ...\nRating:
// N"), its rating and critique picked by a cheap hash of the request body.
// SLOTS = 0 (default): answered at once. SLOTS > 0: at most SLOTS requests are served at once,
// each for a lognormal time (median MEDIAN_S, sigma SIGMA), the rest wait first come first
// served, as a server with continuous batching and a fixed number of sequences.
// POST /v1/embeddings: a 32-dimensional hashing vector per input text (the `--fast-embedder`).
// GET /stats: {served, busy_s (slot-seconds in service), first_start, last_end (seconds),
// most_active}; POST /reset zeroes them. Prints "ready PORT" once listening.

"use strict";
const http = require("http");

const port = parseInt(process.argv[2] || "0", 10);
const slots = parseInt(process.argv[3] || "0", 10);
const medianS = parseFloat(process.argv[4] || "1");
const sigma = parseFloat(process.argv[5] || "0.6");
let seed = parseInt(process.argv[6] || "1", 10) >>> 0;

function random() { // mulberry32: seeded, so two runs serve the same times
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}

function lognormal() {
  const u = 1 - random(), v = random();
  const z = Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  return medianS * Math.exp(sigma * z);
}

const CRITIQUES = [
  "It does not say which units the numbers are in.",
  "A worked example would make the method clear.",
  "It never states the assumptions behind the estimate.",
  "The answer leaves out the most common exception.",
  "Sources for the historical claims are missing.",
  "It skips the edge case of an empty input.",
  "Nothing on how to check the result afterwards.",
  "The trade-offs between the two options are not weighed.",
  "No mention of the safety precautions involved.",
  "It gives no time frame for the steps it lists.",
  "The definition of the key term is missing.",
  "A short summary at the end would help the reader.",
  "It does not address the second half of the question.",
  "Costs are not mentioned at all.",
  "The answer lacks a concrete recommendation.",
  "It misses the counter-argument a critic would raise.",
];
const PAD = "x".repeat(1400); // brings a reply to about 2 KB, as a real completion's size

function reply(content) {
  return Buffer.from(JSON.stringify({
    id: "chatcmpl-standin", object: "chat.completion", created: 0, model: "standin",
    choices: [{index: 0, finish_reason: "stop", logprobs: null,
               message: {role: "assistant", content}}],
    usage: {prompt_tokens: 300, completion_tokens: 40, total_tokens: 340},
    system_fingerprint: PAD,
  }));
}

// Precomputed: 16 critiques x 10 ratings x (text, JSON); a request costs a hash and a write.
const REPLIES = {text: [], json: []};
for (let c = 0; c < CRITIQUES.length; c++) {
  for (let r = 1; r <= 10; r++) {
    REPLIES.text.push(reply(`Missing: ${CRITIQUES[c]}\nRating: ${r}`));
    REPLIES.json.push(reply(JSON.stringify({missing: CRITIQUES[c], rating: r})));
  }
}

function hash(buf) { // FNV-1a over the bytes
  let h = 0x811c9dc5;
  for (let i = 0; i < buf.length; i++) { h ^= buf[i]; h = Math.imul(h, 16777619); }
  return h >>> 0;
}

function embedding(text) {
  const v = new Array(32).fill(0);
  for (const word of text.toLowerCase().split(/\W+/)) {
    if (!word) continue;
    const h = hash(Buffer.from(word));
    v[h % 32] += (h & 1) ? 1 : -1;
  }
  return v;
}

const stats = {served: 0, busy_s: 0, first_start: null, last_end: null, most_active: 0};
let active = 0;
const waiting = [];
const now = () => performance.now() / 1000;

function serve(res, body) {
  const start = now();
  if (stats.first_start === null) stats.first_start = start;
  active++;
  stats.most_active = Math.max(stats.most_active, active);
  const seconds = lognormal();
  setTimeout(() => {
    const end = now();
    stats.busy_s += end - start;
    stats.last_end = end;
    stats.served++;
    active--;
    send(res, 200, body);
    if (waiting.length) { const [r, b] = waiting.shift(); serve(r, b); }
  }, seconds * 1000);
}

function send(res, status, body) {
  res.writeHead(status, {"Content-Type": "application/json", "Content-Length": body.length});
  res.end(body);
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const body = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
    if (req.method === "GET" && req.url === "/stats") {
      return send(res, 200, Buffer.from(JSON.stringify(stats)));
    }
    if (req.method === "POST" && req.url === "/reset") {
      Object.assign(stats, {served: 0, busy_s: 0, first_start: null, last_end: null,
                            most_active: 0});
      return send(res, 200, Buffer.from("{}"));
    }
    if (req.url === "/v1/embeddings") {
      const input = JSON.parse(body).input;
      const texts = Array.isArray(input) ? input : [input];
      const data = texts.map((t, index) => ({object: "embedding", index, embedding: embedding(t)}));
      return send(res, 200, Buffer.from(JSON.stringify({object: "list", data, model: "hash"})));
    }
    if (req.url !== "/v1/chat/completions") {
      return send(res, 404, Buffer.from('{"error": "no such route"}'));
    }
    const h = hash(body);
    const form = body.includes('"response_format"') ? REPLIES.json : REPLIES.text;
    const out = form[h % form.length];
    if (slots <= 0) {
      stats.served++;
      return send(res, 200, out);
    }
    if (active < slots) serve(res, out); else waiting.push([res, out]);
  });
});
server.keepAliveTimeout = 60000;
server.listen(port, "127.0.0.1", () => console.log(`ready ${server.address().port}`));

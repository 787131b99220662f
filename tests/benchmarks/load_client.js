// A minimal fast client for tests/benchmarks/bench_scale.py: what the stand-in server does
// alone. Posts one ~1.5 KB chat request N times, K in flight on keep-alive connections, reads
// each reply whole, and prints {"requests": N, "seconds": wall, "cpu_s": this process's CPU}.
//
//   node load_client.js URL N K

"use strict";
const http = require("http");

const url = new URL(process.argv[2]);
const total = parseInt(process.argv[3], 10);
const inFlight = parseInt(process.argv[4], 10);
const agent = new http.Agent({keepAlive: true, maxSockets: inFlight});
const body = Buffer.from(JSON.stringify({
  model: "judge", temperature: 0, max_tokens: 128, seed: 0, n: 1,
  messages: [{role: "system", content: "Say what is missing, then rate from 1 to 10. ".repeat(8)},
             {role: "user", content: "Question: why is the sky blue?\n\nAnswer: " +
              "Because of Rayleigh scattering of sunlight by the air. ".repeat(14)}],
}));
const options = {agent, method: "POST", hostname: url.hostname, port: url.port,
                 path: url.pathname, headers: {"Content-Type": "application/json",
                                               "Content-Length": body.length}};
let sent = 0, done = 0;
const start = process.hrtime.bigint();
const cpu0 = process.cpuUsage();

function one() {
  if (sent >= total) return;
  sent++;
  const req = http.request(options, (res) => {
    res.on("data", () => {});
    res.on("end", () => {
      done++;
      if (done === total) finish(); else one();
    });
  });
  req.on("error", (e) => { console.error(e); process.exit(1); });
  req.end(body);
}

function finish() {
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  console.log(JSON.stringify({requests: total, seconds, cpu_s: (cpu.user + cpu.system) / 1e6}));
  agent.destroy();
}

for (let i = 0; i < inFlight; i++) one();

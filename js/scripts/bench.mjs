// Benchmark of the JavaScript client under node: shard + seal per answer
// (Client.buildReport: Prio3 sharding with its proof, then two HPKE seals),
// and the size of the browser bundle. A script, not a timed test:
//
//   npm run bench            (from js/; build the bundle first for its size)
//
// Targets (issue 16): <= 5 ms per Count answer, <= 25 ms per Histogram(100,
// chunk 10) answer, bundle <= 200 KiB. Issue 27: <= 50 ms for the Poplar1
// shard of a 16-byte text answer (128 bits), timed both warm (median of many
// in one process) and cold (the first answer of a fresh process, as a
// respondent's page meets it: median over several processes).

import { execFileSync } from 'node:child_process';
import { readFileSync, statSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';

import { Client, Poplar1, b64e, encodeTextAnswer } from '../src/index.js';

const here = dirname(fileURLToPath(import.meta.url));
const bundle = resolve(here, '..', '..', 'src', 'veil', 'web', 'static', 'veil-survey.js');

async function recipientConfig(configId) {
  const pair = await crypto.subtle.generateKey({ name: 'X25519' }, true, ['deriveBits']);
  const raw = new Uint8Array(await crypto.subtle.exportKey('raw', pair.publicKey));
  return { config_id: configId, kem_id: 0x20, kdf_id: 1, aead_id: 1, public_key: raw };
}

async function bench(name, vdaf, measurement, iterations) {
  const task = { task_id: b64e(crypto.getRandomValues(new Uint8Array(32))), vdaf, time_precision: 3600 };
  const client = new Client(task, { leader: await recipientConfig(1), helper: await recipientConfig(2) });
  // Warm up: the JIT, the per-task NTT tables, WebCrypto's first key import.
  for (let i = 0; i < 20; i++) await client.buildReport(measurement);
  // The median and the 90th percentile: on a shared machine the mean follows
  // whatever else runs.
  const times = [];
  for (let i = 0; i < iterations; i++) {
    const start = process.hrtime.bigint();
    await client.buildReport(measurement);
    times.push(Number(process.hrtime.bigint() - start) / 1e6);
  }
  times.sort((a, b) => a - b);
  const median = times[Math.floor(iterations / 2)];
  const p90 = times[Math.floor(iterations * 0.9)];
  console.log(
    `${name.padEnd(40)} median ${median.toFixed(2).padStart(6)} ms, p90 ${p90.toFixed(2).padStart(6)} ms` +
      ` per answer (${iterations} answers)`,
  );
  return median;
}

/** Normalise, encode and shard one 16-byte text answer; both shares encoded. */
function shardTextAnswer(vdaf, answer) {
  const { measurement } = encodeTextAnswer(answer, { maxBytes: 16, bits: 128 });
  const nonce = crypto.getRandomValues(new Uint8Array(vdaf.NONCE_SIZE));
  const rand = crypto.getRandomValues(new Uint8Array(vdaf.RAND_SIZE));
  const { publicShare, inputShares } = vdaf.shard(new Uint8Array(16), measurement, nonce, rand);
  return [vdaf.encodePublicShare(publicShare), ...inputShares.map((s) => vdaf.encodeInputShare(s))];
}

const ANSWER = 'Visual Studio Co';

if (process.argv[2] === '--cold-poplar1') {
  // Child process: the first shard of a fresh runtime, nothing warmed.
  const start = process.hrtime.bigint();
  const cpu = process.cpuUsage();
  shardTextAnswer(new Poplar1(128), ANSWER);
  const wall = Number(process.hrtime.bigint() - start) / 1e6;
  const used = process.cpuUsage(cpu);
  // CPU time (all of node's threads, background compilation included) says
  // what the answer costs on a machine that other work does not crowd.
  console.log(`${wall} ${(used.user + used.system) / 1e3}`);
  process.exit(0);
}

function benchPoplar1(iterations, coldRuns) {
  const vdaf = new Poplar1(128);
  for (let i = 0; i < 50; i++) shardTextAnswer(vdaf, ANSWER);
  const times = [];
  for (let i = 0; i < iterations; i++) {
    const start = process.hrtime.bigint();
    shardTextAnswer(vdaf, ANSWER);
    times.push(Number(process.hrtime.bigint() - start) / 1e6);
  }
  times.sort((a, b) => a - b);
  const cold = [];
  const coldCpu = [];
  for (let i = 0; i < coldRuns; i++) {
    const out = execFileSync(process.execPath, [fileURLToPath(import.meta.url), '--cold-poplar1']);
    const [wall, cpu] = out.toString().trim().split(' ').map(Number);
    cold.push(wall);
    coldCpu.push(cpu);
  }
  cold.sort((a, b) => a - b);
  coldCpu.sort((a, b) => a - b);
  const name = 'Poplar1(128) shard, 16-byte text answer';
  console.log(
    `${name.padEnd(40)} median ${times[Math.floor(iterations / 2)].toFixed(2).padStart(6)} ms, ` +
      `p90 ${times[Math.floor(iterations * 0.9)].toFixed(2).padStart(6)} ms warm (${iterations} answers); ` +
      `first answer of a fresh process: median ${cold[Math.floor(coldRuns / 2)].toFixed(2)} ms ` +
      `(CPU ${coldCpu[Math.floor(coldRuns / 2)].toFixed(2)} ms), max ${cold[coldRuns - 1].toFixed(2)} ms ` +
      `(${coldRuns} processes)`,
  );
}

console.log(`node ${process.version}`);
benchPoplar1(300, 9);
await bench('Count', { type: 'count' }, 1, 500);
await bench('Sum(255)', { type: 'sum', max_measurement: 255 }, 77, 300);
await bench('Histogram(100, chunk 10)', { type: 'histogram', length: 100, chunk_length: 10 }, 42, 200);
await bench(
  'MultihotCountVec(10, weight 3, chunk 3)',
  { type: 'multihot', length: 10, max_weight: 3, chunk_length: 3 },
  [true, false, true, false, false, false, false, false, false, true],
  200,
);
await bench(
  'SumVec(10, max 255, chunk 9)',
  { type: 'sumvec', length: 10, max_measurement: 255, chunk_length: 9 },
  [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
  200,
);
try {
  const size = statSync(bundle).size;
  const gz = gzipSync(readFileSync(bundle)).length;
  console.log(`bundle ${(size / 1024).toFixed(1)} KiB minified, ${(gz / 1024).toFixed(1)} KiB gzipped`);
} catch {
  console.log('bundle not built: run npm run build');
}

// Builds DAP reports with the JavaScript client, for veil's Python tests
// (tests/js/test_js_dap.py): reads one JSON request on stdin,
//   {"task": {task_id, vdaf, time_precision, dp?}, "leader": HpkeConfig,
//    "helper": HpkeConfig, "dap": {version, configuration}, "measurements": [...],
//    "time": seconds}
// and writes one JSON line per measurement: {"report": "<the encoded Report,
// base64url>"} or {"error": "<MeasurementError message>"}.

import { DapClient, b64e, hpkeConfigFromJson } from '../src/index.js';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const request = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const client = new DapClient(
  request.task,
  { leader: hpkeConfigFromJson(request.leader), helper: hpkeConfigFromJson(request.helper) },
  request.dap,
);
for (const measurement of request.measurements) {
  try {
    const report = await client.buildDapReport(measurement, request.time);
    process.stdout.write(`${JSON.stringify({ report: b64e(report) })}\n`);
  } catch (e) {
    if (e.name !== 'MeasurementError') throw e;
    process.stdout.write(`${JSON.stringify({ error: e.message })}\n`);
  }
}

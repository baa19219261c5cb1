// Builds sealed reports with the JavaScript client, for veil's Python tests
// (tests/js): reads one JSON request on stdin,
//   {"task": {task_id, vdaf, time_precision}, "leader": HpkeConfig, "helper": HpkeConfig,
//    "measurements": [...], "time": seconds}
// and writes one JSON line per measurement: {"report": {...}} (reportToJson)
// or {"error": "<MeasurementError message>"}.

import { Client, hpkeConfigFromJson, reportToJson } from '../src/index.js';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const request = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const client = new Client(request.task, {
  leader: hpkeConfigFromJson(request.leader),
  helper: hpkeConfigFromJson(request.helper),
});
for (const measurement of request.measurements) {
  try {
    const report = await client.buildReport(measurement, request.time);
    process.stdout.write(`${JSON.stringify({ report: reportToJson(report) })}\n`);
  } catch (e) {
    if (e.name !== 'MeasurementError') throw e;
    process.stdout.write(`${JSON.stringify({ error: e.message })}\n`);
  }
}

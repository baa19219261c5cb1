// Answers a survey with invitations with the JavaScript client, for veil's
// Python tests (tests/js/test_js_invitations.py): reads one JSON request on stdin,
//   {"issuer": url, "invitation": code, "time": seconds,
//    "questions": [{"task": {task_id, vdaf, time_precision, issuer_public_key},
//                   "leader": HpkeConfig, "helper": HpkeConfig, "measurement": ...}]}
// redeems the invitation for one token per question and writes one JSON line
// per question, {"report": {...}} (reportToJson, with its token), or one line
// {"error": "<the issuer's message>"} if the invitation is refused.

import { Client, InvitationError, hpkeConfigFromJson, redeemInvitation, reportToJson } from '../src/index.js';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const request = JSON.parse(Buffer.concat(chunks).toString('utf8'));
let tickets;
try {
  tickets = await redeemInvitation(
    request.issuer,
    request.invitation,
    request.questions.map((q) => q.task),
  );
} catch (e) {
  if (!(e instanceof InvitationError)) throw e;
  process.stdout.write(`${JSON.stringify({ error: e.message })}\n`);
  process.exit(0);
}
for (const [i, q] of request.questions.entries()) {
  const client = new Client(q.task, {
    leader: hpkeConfigFromJson(q.leader),
    helper: hpkeConfigFromJson(q.helper),
  });
  const report = await client.buildReport(q.measurement, request.time, tickets[i]);
  process.stdout.write(`${JSON.stringify({ report: reportToJson(report) })}\n`);
}

// Answers a survey with invitations with the JavaScript client, for veil's
// Python tests (tests/js/test_js_invitations.py): reads one JSON request on stdin,
//   {"issuer": url, "invitation": code, "time": seconds,
//    "questions": [{"task": {task_id, vdaf, time_precision, issuer_public_key},
//                   "leader": HpkeConfig, "helper": HpkeConfig, "measurement": ...}]}
// seals each question's report, redeems the invitation for one token per
// question bound to it, and writes one JSON line per question,
// {"report": {...}} (reportToJson, with its token), or one line
// {"error": "<the issuer's message>"} if the invitation is refused.

import { Client, InvitationError, hpkeConfigFromJson, redeemInvitation, reportToJson } from '../src/index.js';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const request = JSON.parse(Buffer.concat(chunks).toString('utf8'));
// Each question's report sealed first: its token's challenge commits to it.
const reports = [];
for (const q of request.questions) {
  const client = new Client(q.task, {
    leader: hpkeConfigFromJson(q.leader),
    helper: hpkeConfigFromJson(q.helper),
  });
  reports.push(await client.buildReport(q.measurement, request.time));
}
let tokened;
try {
  tokened = await redeemInvitation(
    request.issuer,
    request.invitation,
    request.questions.map((q) => q.task),
    reports,
  );
} catch (e) {
  if (!(e instanceof InvitationError)) throw e;
  process.stdout.write(`${JSON.stringify({ error: e.message })}\n`);
  process.exit(0);
}
for (const report of tokened) {
  process.stdout.write(`${JSON.stringify({ report: reportToJson(report) })}\n`);
}

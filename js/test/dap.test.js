// DAP report encoding (src/dap.js) against Python's encoding of the same
// inputs, tests/fixtures/dap_js_encodings.json (veil.dap.messages; checked
// against Python by tests/js/test_js_dap.py), field by field; and a built
// report's layout. Sealed reports opened and aggregated by Python:
// tests/js/test_js_dap.py.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { b64d, b64e } from '../src/client.js';
import {
  DapClient,
  dapInputShareInfo,
  dapVdafContext,
  encodeCiphertext,
  encodeInputShareAad,
  encodePlaintextInputShare,
  encodeReportMetadata,
} from '../src/dap.js';
import { ROLE_HELPER, ROLE_LEADER } from '../src/hpke.js';
import { concat } from '../src/prio3.js';

const here = dirname(fileURLToPath(import.meta.url));
const fixture = JSON.parse(
  readFileSync(resolve(here, '..', '..', 'tests', 'fixtures', 'dap_js_encodings.json'), 'utf8'),
);
const hex = (bytes) => Buffer.from(bytes).toString('hex');
const bytes = (text) => Uint8Array.from(Buffer.from(text, 'hex'));
const ct = (c) => ({ config_id: c.config_id, enc: bytes(c.enc), payload: bytes(c.payload) });
const taskId = bytes(fixture.task_id);

test('ReportMetadata, InputShareAad and PlaintextInputShare as Python encodes them', () => {
  const metadata = encodeReportMetadata(bytes(fixture.report_id), fixture.time);
  assert.equal(hex(metadata), fixture.metadata_encoded);
  const aad = encodeInputShareAad(
    taskId,
    bytes(fixture.configuration),
    metadata,
    bytes(fixture.public_share),
  );
  assert.equal(hex(aad), fixture.input_share_aad);
  assert.equal(hex(encodePlaintextInputShare(bytes(fixture.payload))), fixture.plaintext_input_share);
});

test('a Report as Python encodes it', () => {
  const ps = bytes(fixture.public_share);
  const report = concat(
    encodeReportMetadata(bytes(fixture.report_id), fixture.time),
    Uint8Array.of(0, 0, 0, ps.length),
    ps,
    encodeCiphertext(ct(fixture.leader)),
    encodeCiphertext(ct(fixture.helper)),
  );
  assert.equal(hex(report), fixture.report);
});

test("each draft's info and VDAF context", () => {
  for (const [version, want] of Object.entries(fixture.info)) {
    assert.equal(hex(dapInputShareInfo(version, ROLE_LEADER)), want.leader);
    assert.equal(hex(dapInputShareInfo(version, ROLE_HELPER)), want.helper);
    assert.equal(hex(dapVdafContext(version, taskId)), want.vdaf_context);
  }
  assert.throws(() => dapInputShareInfo('dap-17', ROLE_LEADER), RangeError);
  assert.throws(() => dapInputShareInfo('dap-19', 1), RangeError);
});

test('out-of-range fields are refused, not truncated', () => {
  assert.throws(() => encodeReportMetadata(new Uint8Array(15), 0), RangeError);
  assert.throws(() => encodeReportMetadata(new Uint8Array(16), -1), RangeError);
  assert.throws(() => encodeCiphertext({ config_id: 256, enc: bytes('01'), payload: bytes('01') }), RangeError);
  assert.throws(() => encodeCiphertext({ config_id: 1, enc: new Uint8Array(0), payload: bytes('01') }), RangeError);
  assert.throws(() => encodeCiphertext({ config_id: 1, enc: bytes('01'), payload: new Uint8Array(0) }), RangeError);
});

test('a built report: metadata, then the public share, then two ciphertexts', async () => {
  const key = Uint8Array.from({ length: 32 }, (_, i) => i + 9);
  const config = { config_id: 7, public_key: key };
  const task = { task_id: b64e(taskId), vdaf: { type: 'count' }, time_precision: 3600 };
  const client = new DapClient(task, { leader: config, helper: { ...config, config_id: 8 } }, {
    version: 'dap-19',
    configuration: b64e(bytes(fixture.configuration)),
  });
  const report = await client.buildDapReport(1, 3600 * 480_000 + 5);
  const view = new DataView(report.buffer);
  assert.equal(view.getBigUint64(16), 480_000n); // in time precisions
  assert.equal(view.getUint16(24), 0); // no public extensions
  const psLen = view.getUint32(26);
  let at = 30 + psLen;
  for (const id of [7, 8]) {
    assert.equal(report[at], id);
    const enc = view.getUint16(at + 1);
    assert.equal(enc, 32);
    const payload = view.getUint32(at + 3 + enc);
    at += 3 + enc + 4 + payload;
  }
  assert.equal(at, report.length);
  await assert.rejects(client.buildDapReport(2), { name: 'MeasurementError' });
  assert.throws(
    () => new DapClient(task, { leader: config, helper: config }, { version: 'dap-20', configuration: 'AA' }),
    RangeError,
  );
});

// An invited report (a survey with invitations: veil.dap.invitation) built
// by the JS client from the inputs of tests/fixtures/dap_js_invitation.json,
// where Python's prepare_invited and upload_invited wrote their outputs
// (tests/js/test_js_dap.py checks them): the same leader key digest,
// redemption context and Report, byte for byte, with the extension public
// or in the leader's share.
const invited = JSON.parse(
  readFileSync(resolve(here, '..', '..', 'tests', 'fixtures', 'dap_js_invitation.json'), 'utf8'),
);

for (const c of invited.cases) {
  test(`an invited report as Python builds it (${c.vdaf.type}, extension ${c.invitation})`, async () => {
    // The JS client draws, in order: report id, VDAF randomness, the
    // leader's and the helper's ephemeral keys.
    const draws = [c.report_id, c.rand, ...c.ephemerals].map(bytes);
    const client = new DapClient(
      { task_id: b64e(bytes(c.task_id)), vdaf: c.vdaf, time_precision: c.time_precision },
      {
        leader: { config_id: c.leader.config_id, public_key: bytes(c.leader.public_key) },
        helper: { config_id: c.helper.config_id, public_key: bytes(c.helper.public_key) },
      },
      { version: c.version, configuration: b64e(bytes(c.configuration)), invitation: c.invitation },
      {
        randomBytes: (n) => {
          const next = draws.shift();
          assert.equal(next.length, n);
          return next;
        },
      },
    );
    const prepared = await client.prepareInvited(c.measurement, c.time * c.time_precision + 7);
    assert.equal(draws.length, 0);
    assert.equal(hex(b64d(prepared.leader_key_digest)), c.leader_key_digest);
    assert.equal(hex(b64d(prepared.context)), c.context);
    // Kept as JSON by the page until the issuer answers.
    const kept = JSON.parse(JSON.stringify(prepared));
    const report = await client.sealInvited(kept, bytes(c.token));
    assert.equal(hex(report), c.report);
  });
}

// The page keeps an invited report (as JSON) until the issuer answers; a
// retry, or a reload with a new client, seals it again with the same
// ephemeral keys (the token committed to their encapsulated keys): the same
// report, byte for byte, since its content and the token are the same.
test('a retry or a reload seals an invited report to the same bytes', async () => {
  const c = invited.cases[1];
  const task = { task_id: b64e(bytes(c.task_id)), vdaf: c.vdaf, time_precision: c.time_precision };
  const configs = {
    leader: { config_id: c.leader.config_id, public_key: bytes(c.leader.public_key) },
    helper: { config_id: c.helper.config_id, public_key: bytes(c.helper.public_key) },
  };
  const dap = { version: c.version, configuration: b64e(bytes(c.configuration)), invitation: c.invitation };
  const kept = JSON.stringify(await new DapClient(task, configs, dap).prepareInvited(c.measurement));
  const first = await new DapClient(task, configs, dap).sealInvited(JSON.parse(kept), bytes(c.token));
  const again = await new DapClient(task, configs, dap).sealInvited(JSON.parse(kept), bytes(c.token));
  assert.equal(hex(again), hex(first));
  // Control: a report drawn anew is other bytes.
  const other = await new DapClient(task, configs, dap).prepareInvited(c.measurement);
  assert.notEqual(hex(await new DapClient(task, configs, dap).sealInvited(other, bytes(c.token))), hex(first));
});

test('an invited report needs a task with invitations and a token of the right size', async () => {
  const c = invited.cases[0];
  const task = { task_id: b64e(bytes(c.task_id)), vdaf: c.vdaf, time_precision: c.time_precision };
  const configs = {
    leader: { config_id: 3, public_key: bytes(c.leader.public_key) },
    helper: { config_id: 4, public_key: bytes(c.helper.public_key) },
  };
  const dap = { version: c.version, configuration: b64e(bytes(c.configuration)) };
  await assert.rejects(new DapClient(task, configs, dap).prepareInvited(1), RangeError);
  assert.throws(() => new DapClient(task, configs, { ...dap, invitation: 'helper' }), RangeError);
  const client = new DapClient(task, configs, { ...dap, invitation: 'public' });
  await assert.rejects(client.prepareInvited(2), { name: 'MeasurementError' });
  const prepared = await client.prepareInvited(1);
  await assert.rejects(client.sealInvited(prepared, bytes(c.token).subarray(1)), RangeError);
});

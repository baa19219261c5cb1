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

import { b64e } from '../src/client.js';
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

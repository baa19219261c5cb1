// The client module on its own: report structure, the HPKE context binding
// (opened here with @hpke/core as the recipient; the Python side opens them
// in tests/js), and measurements refused before anything is drawn.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Aes128Gcm, CipherSuite, DhkemX25519HkdfSha256, HkdfSha256 } from '@hpke/core';

import { Client, MeasurementError, b64d, b64e, reportToJson } from '../src/index.js';
import { ROLE_HELPER, ROLE_LEADER, inputShareInfo } from '../src/hpke.js';

const suite = new CipherSuite({
  kem: new DhkemX25519HkdfSha256(),
  kdf: new HkdfSha256(),
  aead: new Aes128Gcm(),
});

async function recipient(configId) {
  const pair = await suite.kem.generateKeyPair();
  const raw = new Uint8Array(await suite.kem.serializePublicKey(pair.publicKey));
  return { pair, config: { config_id: configId, kem_id: 0x20, kdf_id: 1, aead_id: 1, public_key: raw } };
}

const TASK = {
  task_id: b64e(new Uint8Array(32).fill(7)),
  vdaf: { type: 'histogram', length: 4, chunk_length: 2 },
  time_precision: 60,
};

test('a report opens only under its own context', async () => {
  const leader = await recipient(3);
  const helper = await recipient(9);
  const client = new Client(TASK, { leader: leader.config, helper: helper.config });
  const report = await client.buildReport(2, 1_000_003);
  assert.equal(report.time, 999_960);
  assert.equal(report.report_id.length, 16);
  assert.equal(report.public_share.length, 64);
  const taskId = b64d(TASK.task_id);
  for (const [role, who, ct] of [
    [ROLE_LEADER, leader, report.leader_encrypted_input_share],
    [ROLE_HELPER, helper, report.helper_encrypted_input_share],
  ]) {
    const info = inputShareInfo(role, taskId, report.report_id, report.time, report.public_share);
    const open = (i) =>
      suite.open({ recipientKey: who.pair, enc: ct.enc, info: i }, ct.payload);
    const plaintext = new Uint8Array(await open(info));
    assert.ok(plaintext.length > 0);
    // Another role, time or report id in the context: the share does not open.
    const other = inputShareInfo(role ^ 1, taskId, report.report_id, report.time, report.public_share);
    await assert.rejects(open(other));
    const later = inputShareInfo(role, taskId, report.report_id, report.time + 60, report.public_share);
    await assert.rejects(open(later));
  }
  const json = reportToJson(report);
  assert.deepEqual(Object.keys(json).sort(), [
    'helper_encrypted_input_share', 'leader_encrypted_input_share', 'public_share', 'report_id', 'time',
  ]);
  assert.deepEqual(b64d(json.report_id), report.report_id);
});

test('bad measurements are refused before any randomness is drawn', async () => {
  const leader = await recipient(1);
  const helper = await recipient(2);
  let drawn = 0;
  const client = new Client(TASK, { leader: leader.config, helper: helper.config }, {
    randomBytes: (n) => {
      drawn += n;
      return new Uint8Array(n);
    },
  });
  for (const [bad, message] of [
    [4, 'Histogram measurement must be in [0, 3], got 4'],
    ['1', 'Histogram measurement must be an int, not str'],
    [true, 'Histogram measurement must be an int, not bool'],
    [1.5, 'Histogram measurement must be an int, not float'],
  ]) {
    await assert.rejects(client.buildReport(bad), (e) => e instanceof MeasurementError && e.message === message);
  }
  assert.equal(drawn, 0);
});

test('base64url is unpadded and strict', () => {
  assert.equal(b64e(new Uint8Array([251, 255])), '-_8');
  assert.deepEqual(b64d('-_8'), new Uint8Array([251, 255]));
  assert.throws(() => b64d('+/8='));
});

test('an unsupported HPKE suite is refused', async () => {
  const leader = await recipient(1);
  const client = new Client(TASK, {
    leader: { ...leader.config, aead_id: 3 },
    helper: leader.config,
  });
  await assert.rejects(client.buildReport(0), /unsupported suite/);
});

test('a text answer is sharded with Poplar1 and sealed like any report', async () => {
  const { encodeTextAnswer } = await import('../src/text.js');
  const task = { ...TASK, vdaf: { type: 'poplar1', bits: 32 } };
  const [leader, helper] = [await recipient(1), await recipient(2)];
  const client = new Client(task, { leader: leader.config, helper: helper.config });
  const report = await client.buildReport(encodeTextAnswer('vim', { maxBytes: 4 }).measurement);
  // IDPF key 16, correlation seed 32, 31 inner pairs of Field64, one Field255 pair;
  // sealed with a 16-byte tag.
  const share = 16 + 32 + 2 * 31 * 8 + 2 * 32;
  assert.equal(report.leader_encrypted_input_share.payload.length, share + 16);
  assert.equal(report.helper_encrypted_input_share.payload.length, share + 16);
  assert.ok(report.public_share.length > 0);
  await assert.rejects(client.buildReport([true, false]), MeasurementError);
  assert.throws(
    () => new Client({ ...task, vdaf: { type: 'poplar1', bits: 12 } }, {}),
    /multiple of 8/,
  );
});

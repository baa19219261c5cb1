// The client (veil.client.client): shard a measurement with Prio3 (or Poplar1,
// for a text question's answer: its bits from ./text.js), seal each
// input share to its aggregator with HPKE, and encode the report for upload.
//
// Each report gets a fresh random 16-byte report id, which is also the VDAF
// nonce; the context string is "veil-v1" || task id, and the report time is
// rounded down to the task's time_precision: exactly what the Python client
// does, so the leader cannot tell the two apart.

import { HpkeError, ROLE_HELPER, ROLE_LEADER, inputShareInfo, isSupported, seal } from './hpke.js';
import { localChannel } from './local.js';
import { Poplar1 } from './poplar1.js';
import { concat, prio3FromSpec } from './prio3.js';

export const TASK_ID_SIZE = 32;
export const REPORT_ID_SIZE = 16;
const CONTEXT_PREFIX = new TextEncoder().encode('veil-v1');

/**
 * What the client knows of a task: its public description (the "task_id",
 * "vdaf", "time_precision" and, for a local layer, "dp" of a client task file,
 * veil.task.Task.to_dict). With `dp.local_epsilon` every measurement is
 * randomized on this device before sharding (./local.js, veil.dp.local).
 * @typedef {{task_id: string, vdaf: {type: string, [k: string]: any}, time_precision: number,
 *   dp?: {local_epsilon?: string, local_max_choices?: number}}} TaskDescription
 */

/**
 * @typedef {import('./hpke.js').Ciphertext} Ciphertext
 * @typedef {{report_id: Uint8Array, time: number, public_share: Uint8Array,
 *   leader_encrypted_input_share: Ciphertext, helper_encrypted_input_share: Ciphertext,
 *   token?: Uint8Array}} Report
 */

/** Unpadded base64url, as in veil's task files (veil.task.b64e). @param {Uint8Array} bytes */
export function b64e(bytes) {
  let bin = '';
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

/** Inverse of b64e; throws on anything else. @param {string} text */
export function b64d(text) {
  if (typeof text !== 'string' || !/^[A-Za-z0-9_-]*$/.test(text)) {
    throw new TypeError('not unpadded base64url text');
  }
  const bin = atob(text.replace(/-/g, '+').replace(/_/g, '/'));
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}

/**
 * An aggregator's HPKE config from its JSON form ({config_id, kem_id, kdf_id,
 * aead_id, public_key as base64url}).
 * @param {any} json
 * @returns {import('./hpke.js').HpkeConfig}
 */
export function hpkeConfigFromJson(json) {
  return {
    config_id: json.config_id,
    kem_id: json.kem_id,
    kdf_id: json.kdf_id,
    aead_id: json.aead_id,
    public_key: b64d(json.public_key),
  };
}

/**
 * The first config of an aggregator's list with veil's suite.
 * @param {import('./hpke.js').HpkeConfig[]} configs
 */
export function usableConfig(configs) {
  const usable = configs.find(isSupported);
  if (usable === undefined) {
    throw new HpkeError(
      'the aggregator offers no HPKE config with X25519/HKDF-SHA256/AES-128-GCM',
    );
  }
  return usable;
}

/** Builds reports for one task. */
export class Client {
  /**
   * @param {TaskDescription} task
   * @param {{leader: import('./hpke.js').HpkeConfig, helper: import('./hpke.js').HpkeConfig}} configs
   *   each aggregator's HPKE config
   * @param {{now?: () => number, randomBytes?: (n: number) => Uint8Array}} [options]
   *   the clock (seconds) and the source of randomness; tests replace them
   */
  constructor(task, configs, options = {}) {
    this.task = task;
    this.taskId = b64d(task.task_id);
    if (this.taskId.length !== TASK_ID_SIZE) {
      throw new RangeError(`task id must be ${TASK_ID_SIZE} bytes, got ${this.taskId.length}`);
    }
    if (!Number.isSafeInteger(task.time_precision) || task.time_precision < 1) {
      throw new RangeError('time_precision must be a positive integer');
    }
    this.vdaf = vdafFromSpec(task.vdaf);
    this.ctx = concat(CONTEXT_PREFIX, this.taskId);
    this.configs = configs;
    this.now = options.now ?? (() => Date.now() / 1000);
    this.randomBytes =
      options.randomBytes ?? ((n) => globalThis.crypto.getRandomValues(new Uint8Array(n)));
    this.randomize = localChannel(task.vdaf, task.dp, this.randomBytes);
  }

  /** The current time rounded down to the task's time_precision. */
  reportTime() {
    const now = Math.floor(this.now());
    return now - (now % this.task.time_precision);
  }

  /**
   * Shard and seal one measurement. Throws MeasurementError on an invalid
   * measurement (before anything is drawn or sealed).
   * @param {unknown} measurement
   * @param {number} [reportTime] defaults to now
   * @returns {Promise<Report>} without a token: for a survey with invitations,
   *   src/invite.js has one issued for the report as sealed, and sets it
   */
  async buildReport(measurement, reportTime) {
    let t = reportTime ?? this.reportTime();
    t -= t % this.task.time_precision;
    // Validate first, so that a bad measurement costs nothing.
    if (this.vdaf instanceof Poplar1) this.vdaf._checkMeasurement(measurement);
    else this.vdaf.flp.encode(measurement);
    // The true answer goes no further than this line with a local layer.
    const sent = this.randomize === null ? measurement : this.randomize(measurement);
    const reportId = this.randomBytes(REPORT_ID_SIZE);
    const rand = this.randomBytes(this.vdaf.RAND_SIZE);
    const { publicShare, inputShares } = this.vdaf.shard(this.ctx, sent, reportId, rand);
    const ps = this.vdaf.encodePublicShare(publicShare);
    const [leaderCt, helperCt] = await Promise.all([
      seal(
        this.configs.leader,
        inputShareInfo(ROLE_LEADER, this.taskId, reportId, t, ps),
        this.vdaf.encodeInputShare(inputShares[0]),
      ),
      seal(
        this.configs.helper,
        inputShareInfo(ROLE_HELPER, this.taskId, reportId, t, ps),
        this.vdaf.encodeInputShare(inputShares[1]),
      ),
    ]);
    return {
      token: new Uint8Array(0),
      report_id: reportId,
      time: t,
      public_share: ps,
      leader_encrypted_input_share: leaderCt,
      helper_encrypted_input_share: helperCt,
    };
  }
}

/**
 * The VDAF of a task file's [vdaf] table: a Prio3 type, or Poplar1 (`bits`).
 * @param {{type: string, [k: string]: any}} spec
 */
function vdafFromSpec(spec) {
  if (spec.type === 'poplar1') {
    if (!Number.isInteger(spec.bits) || spec.bits < 8 || spec.bits % 8) {
      throw new RangeError(`a poplar1 task's bits must be a positive multiple of 8, got ${spec.bits}`);
    }
    return new Poplar1(spec.bits);
  }
  return prio3FromSpec(spec);
}

/** @param {Ciphertext} ct */
function ciphertextJson(ct) {
  return { config_id: ct.config_id, enc: b64e(ct.enc), payload: b64e(ct.payload) };
}

/**
 * A report as JSON for `veil survey serve` (the fields of the protocol's
 * Report message, bytes as unpadded base64url).
 * @param {Report} report
 */
export function reportToJson(report) {
  return {
    report_id: b64e(report.report_id),
    time: report.time,
    public_share: b64e(report.public_share),
    leader_encrypted_input_share: ciphertextJson(report.leader_encrypted_input_share),
    helper_encrypted_input_share: ciphertextJson(report.helper_encrypted_input_share),
    ...(report.token?.length ? { token: b64e(report.token) } : {}),
  };
}

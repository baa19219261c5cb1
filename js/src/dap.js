// A DAP client's report (draft-ietf-ppm-dap section 4.4.2, "Client
// Behavior"; veil.dap.report): the measurement sharded under the context
// tag || task id with the report id as nonce, each input share wrapped in a
// PlaintextInputShare and sealed to its aggregator with the draft's `info`
// and the report's InputShareAad, the whole in the draft's TLS-syntax
// Report encoding (veil.dap.messages), ready for an UploadRequest.
//
// The TaskConfiguration every share binds comes encoded from the task's
// owner (`veil survey deploy --protocol dap` prints it, and
// Task.dap_configuration() builds it): this client writes no part of it.

import { Client, REPORT_ID_SIZE, TASK_ID_SIZE, b64d } from './client.js';
import { ROLE_CLIENT, ROLE_HELPER, ROLE_LEADER, seal } from './hpke.js';
import { Poplar1 } from './poplar1.js';
import { concat } from './prio3.js';

/** The drafts veil speaks (veil.dap.versions): each one's version tag. */
export const DAP_VERSIONS = ['dap-19', 'dap-18'];

const encoder = new TextEncoder();

/** The version tag of `version`, or a RangeError. @param {string} version */
function tag(version) {
  if (!DAP_VERSIONS.includes(version)) {
    throw new RangeError(`DAP version must be one of ${DAP_VERSIONS.join(', ')}, got ${version}`);
  }
  return encoder.encode(version);
}

/** The VDAF context of a DAP task: tag || task id. @param {string} version @param {Uint8Array} taskId */
export function dapVdafContext(version, taskId) {
  return concat(tag(version), taskId);
}

/**
 * HPKE `info` of an input share sealed by a client to `serverRole`:
 * tag " input share" || 0x01 || server role.
 * @param {string} version @param {number} serverRole
 */
export function dapInputShareInfo(version, serverRole) {
  if (serverRole !== ROLE_LEADER && serverRole !== ROLE_HELPER) {
    throw new RangeError('an input share is sealed to the leader or the helper');
  }
  return concat(tag(version), encoder.encode(' input share'), Uint8Array.of(ROLE_CLIENT, serverRole));
}

/** `value` in `size` bytes, big-endian. @param {number} value @param {number} size */
function uint(value, size) {
  if (!Number.isSafeInteger(value) || value < 0 || (size < 8 && value >= 2 ** (8 * size))) {
    throw new RangeError(`${value} does not fit in ${size} bytes`);
  }
  const out = new Uint8Array(size);
  let rest = BigInt(value);
  for (let i = size - 1; i >= 0; i--, rest >>= 8n) out[i] = Number(rest & 0xffn);
  return out;
}

/**
 * An opaque vector: its length in `size` bytes, then its bytes.
 * @param {Uint8Array} bytes @param {number} size @param {number} [min]
 */
function opaque(bytes, size, min = 0) {
  if (bytes.length < min || bytes.length >= 2 ** (8 * size)) {
    throw new RangeError(`a vector of ${bytes.length} bytes does not fit its ${size}-byte length`);
  }
  return concat(uint(bytes.length, size), bytes);
}

/**
 * ReportMetadata: report_id[16] || time (uint64, in time precisions) ||
 * public_extensions<0..2^16-1> (none).
 * @param {Uint8Array} reportId @param {number} time
 */
export function encodeReportMetadata(reportId, time) {
  if (reportId.length !== REPORT_ID_SIZE) {
    throw new RangeError(`report id must be ${REPORT_ID_SIZE} bytes`);
  }
  return concat(reportId, uint(time, 8), new Uint8Array(2));
}

/**
 * InputShareAad: task_id[32] || TaskConfiguration || ReportMetadata ||
 * public_share<0..2^32-1>.
 * @param {Uint8Array} taskId @param {Uint8Array} configuration the encoded TaskConfiguration
 * @param {Uint8Array} metadata the encoded ReportMetadata @param {Uint8Array} publicShare
 */
export function encodeInputShareAad(taskId, configuration, metadata, publicShare) {
  return concat(taskId, configuration, metadata, opaque(publicShare, 4));
}

/**
 * PlaintextInputShare: private_extensions<0..2^16-1> (none) || payload<0..2^32-1>.
 * @param {Uint8Array} payload the encoded input share
 */
export function encodePlaintextInputShare(payload) {
  return concat(new Uint8Array(2), opaque(payload, 4));
}

/**
 * HpkeCiphertext: config_id || enc<1..2^16-1> || payload<1..2^32-1>.
 * @param {import('./hpke.js').Ciphertext} ct
 */
export function encodeCiphertext(ct) {
  return concat(uint(ct.config_id, 1), opaque(ct.enc, 2, 1), opaque(ct.payload, 4, 1));
}

/** Builds DAP reports for one task: `Client`'s measurement checks, local layer and VDAF. */
export class DapClient extends Client {
  /**
   * @param {import('./client.js').TaskDescription} task
   * @param {{leader: import('./hpke.js').HpkeConfig, helper: import('./hpke.js').HpkeConfig}} configs
   *   each aggregator's HPKE config, from its DAP HpkeConfigList
   * @param {{version: string, configuration: string}} dap the draft's version
   *   ("dap-19" or "dap-18") and the encoded TaskConfiguration, base64url
   * @param {{now?: () => number, randomBytes?: (n: number) => Uint8Array}} [options]
   */
  constructor(task, configs, dap, options = {}) {
    super(task, configs, options);
    if (this.vdaf instanceof Poplar1) throw new RangeError('a poplar1 task is not served over DAP');
    this.version = dap.version;
    this.ctx = dapVdafContext(dap.version, this.taskId);
    this.configuration = b64d(dap.configuration);
    if (this.taskId.length !== TASK_ID_SIZE || this.configuration.length === 0) {
      throw new RangeError('a DAP task needs its id and its encoded TaskConfiguration');
    }
  }

  /**
   * Shard and seal one measurement into an encoded DAP Report. Throws
   * MeasurementError on an invalid measurement (before anything is drawn).
   * @param {unknown} measurement
   * @param {number} [reportTime] seconds, defaults to now; rounded down to the time precision
   * @returns {Promise<Uint8Array>}
   */
  async buildDapReport(measurement, reportTime) {
    const tp = this.task.time_precision;
    const t = reportTime ?? this.reportTime();
    this.vdaf.flp.encode(measurement);
    // The true answer goes no further than this line with a local layer.
    const sent = this.randomize === null ? measurement : this.randomize(measurement);
    const reportId = this.randomBytes(REPORT_ID_SIZE);
    const rand = this.randomBytes(this.vdaf.RAND_SIZE);
    const { publicShare, inputShares } = this.vdaf.shard(this.ctx, sent, reportId, rand);
    const ps = this.vdaf.encodePublicShare(publicShare);
    // DAP counts a report's time in time precisions (veil.dap.report).
    const metadata = encodeReportMetadata(reportId, Math.floor(t / tp));
    const aad = encodeInputShareAad(this.taskId, this.configuration, metadata, ps);
    const [leaderCt, helperCt] = await Promise.all(
      [
        [this.configs.leader, ROLE_LEADER, inputShares[0]],
        [this.configs.helper, ROLE_HELPER, inputShares[1]],
      ].map(([config, role, share]) =>
        seal(
          config,
          dapInputShareInfo(this.version, role),
          encodePlaintextInputShare(this.vdaf.encodeInputShare(share)),
          aad,
        ),
      ),
    );
    return concat(metadata, opaque(ps, 4), encodeCiphertext(leaderCt), encodeCiphertext(helperCt));
  }
}

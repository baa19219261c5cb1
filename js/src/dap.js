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
//
// A survey with invitations (veil.dap.invitation, docs/DAP.md "Invitations
// over DAP"): the report's token rides in veil's InvitationExtension, a
// public extension (or, where the helper is another implementation, one in
// the leader's PlaintextInputShare), which is inside what both shares are
// sealed with. So the token cannot commit to the sealed shares: it commits
// to their HPKE config ids and encapsulated keys, drawn first
// (`prepareInvited`); the report is sealed under those keys once the token
// is back (`sealInvited`).

import { sha256 } from '@noble/hashes/sha2.js';

import { Client, REPORT_ID_SIZE, TASK_ID_SIZE, b64d, b64e } from './client.js';
import { ROLE_CLIENT, ROLE_HELPER, ROLE_LEADER, ephemeralEnc, seal } from './hpke.js';
import { dapRedemptionContext } from './invite.js';
import { Poplar1 } from './poplar1.js';
import { concat } from './prio3.js';

/** veil's report extension carrying an invitation token (veil.dap.invitation). */
export const INVITATION_EXTENSION = 0xff56;
/** The bytes of an InvitationExtension's data: the token, then a SHA-256. */
export const INVITATION_DATA_SIZE = 354 + 32;
/** Where a task's invitation extension goes: the report's public extensions, or the leader's share. */
export const INVITATION_PLACES = ['public', 'leader'];

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

/** @typedef {{type: number, data: Uint8Array}} Extension */

/**
 * A list of Extensions: extension_type (uint16) || extension_data<0..2^16-1>
 * each, the whole in a 2-byte length.
 * @param {Extension[]} extensions
 */
function encodeExtensions(extensions) {
  return opaque(concat(...extensions.map((e) => concat(uint(e.type, 2), opaque(e.data, 2)))), 2);
}

/**
 * ReportMetadata: report_id[16] || time (uint64, in time precisions) ||
 * public_extensions<0..2^16-1>.
 * @param {Uint8Array} reportId @param {number} time @param {Extension[]} [extensions]
 */
export function encodeReportMetadata(reportId, time, extensions = []) {
  if (reportId.length !== REPORT_ID_SIZE) {
    throw new RangeError(`report id must be ${REPORT_ID_SIZE} bytes`);
  }
  return concat(reportId, uint(time, 8), encodeExtensions(extensions));
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
 * PlaintextInputShare: private_extensions<0..2^16-1> || payload<0..2^32-1>.
 * @param {Uint8Array} payload the encoded input share @param {Extension[]} [extensions]
 */
export function encodePlaintextInputShare(payload, extensions = []) {
  return concat(encodeExtensions(extensions), opaque(payload, 4));
}

/**
 * SHA-256 of a sealed share's HPKE config id (one byte) and encapsulated
 * key (veil.dap.invitation.sealed_key_digest).
 * @param {number} configId @param {Uint8Array} enc
 */
export function sealedKeyDigest(configId, enc) {
  return sha256(concat(uint(configId, 1), enc));
}

/**
 * veil's InvitationExtension: the token, then the leader's key digest.
 * @param {Uint8Array} token @param {Uint8Array} leaderKeyDigest
 * @returns {Extension}
 */
export function invitationExtension(token, leaderKeyDigest) {
  const data = concat(token, leaderKeyDigest);
  if (data.length !== INVITATION_DATA_SIZE || leaderKeyDigest.length !== 32) {
    throw new RangeError(`an invitation extension's data is ${INVITATION_DATA_SIZE} bytes`);
  }
  return { type: INVITATION_EXTENSION, data };
}

/**
 * An invited report between `prepareInvited` and `sealInvited`, as JSON
 * (kept by the page until the issuer answered): what the report is built
 * from (time in time precisions; measurement as sent, after any local
 * layer), the HPKE configs and ephemeral private keys its shares are sealed
 * with, and the redemption context its token is signed for. Every byte
 * string in base64url.
 * @typedef {{time: number, report_id: string, rand: string, measurement: any,
 *   leader: {config_id: number, public_key: string}, helper: {config_id: number, public_key: string},
 *   ephemerals: string[], leader_key_digest: string, context: string}} InvitedReport
 */

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
   * @param {{version: string, configuration: string, invitation?: string}} dap the
   *   draft's version ("dap-19" or "dap-18"), the encoded TaskConfiguration,
   *   base64url, and for a task with invitations where its extension goes
   *   (`INVITATION_PLACES`)
   * @param {{now?: () => number, randomBytes?: (n: number) => Uint8Array}} [options]
   */
  constructor(task, configs, dap, options = {}) {
    super(task, configs, options);
    if (this.vdaf instanceof Poplar1) throw new RangeError('a poplar1 task is not served over DAP');
    this.version = dap.version;
    this.invitation = dap.invitation ?? null;
    if (this.invitation !== null && !INVITATION_PLACES.includes(this.invitation)) {
      throw new RangeError(`an invitation extension goes in ${INVITATION_PLACES.join(' or ')}`);
    }
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
    const t = reportTime ?? this.reportTime();
    this.vdaf.flp.encode(measurement);
    // The true answer goes no further than this line with a local layer.
    const sent = this.randomize === null ? measurement : this.randomize(measurement);
    const reportId = this.randomBytes(REPORT_ID_SIZE);
    const rand = this.randomBytes(this.vdaf.RAND_SIZE);
    // DAP counts a report's time in time precisions (veil.dap.report).
    const time = Math.floor(t / this.task.time_precision);
    return this.sealReport(sent, time, reportId, rand, this.configs.leader, this.configs.helper);
  }

  /**
   * The first half of an invited report (veil.dap.invitation; Python's
   * `DapClient.prepare_invited`): the measurement checked (and randomized,
   * with a local layer), its randomness and its shares' ephemeral HPKE keys
   * drawn, and the redemption context its token must be signed for. Throws
   * MeasurementError on an invalid measurement, before anything is drawn.
   * @param {unknown} measurement
   * @param {number} [reportTime] seconds, defaults to now; rounded down to the time precision
   * @returns {Promise<InvitedReport>}
   */
  async prepareInvited(measurement, reportTime) {
    if (this.invitation === null) throw new RangeError('this DAP task takes no invitation token');
    const tp = this.task.time_precision;
    const time = Math.floor((reportTime ?? this.reportTime()) / tp);
    this.vdaf.flp.encode(measurement);
    const sent = this.randomize === null ? measurement : this.randomize(measurement);
    const reportId = this.randomBytes(REPORT_ID_SIZE);
    const rand = this.randomBytes(this.vdaf.RAND_SIZE);
    const ephemerals = [this.randomBytes(32), this.randomBytes(32)];
    const { leader, helper } = this.configs;
    const [leaderDigest, helperDigest] = await Promise.all(
      [leader, helper].map(async (c, i) => sealedKeyDigest(c.config_id, await ephemeralEnc(ephemerals[i]))),
    );
    // Sharded here for the public share the context commits to; sharded
    // again, to the same bytes, when the report is sealed.
    const { publicShare } = this.vdaf.shard(this.ctx, sent, reportId, rand);
    const context = dapRedemptionContext(
      this.taskId,
      reportId,
      time * tp,
      this.vdaf.encodePublicShare(publicShare),
      leaderDigest,
      helperDigest,
    );
    const config = (/** @type {import('./hpke.js').HpkeConfig} */ c) => ({
      config_id: c.config_id,
      public_key: b64e(c.public_key),
    });
    return {
      time,
      report_id: b64e(reportId),
      rand: b64e(rand),
      measurement: sent,
      leader: config(leader),
      helper: config(helper),
      ephemerals: ephemerals.map(b64e),
      leader_key_digest: b64e(leaderDigest),
      context: b64e(context),
    };
  }

  /**
   * Seal a report from `prepareInvited` with its token in the invitation
   * extension: a public extension, or in the leader's input share where the
   * task says so (the helper is another implementation). The encoded Report.
   * @param {InvitedReport} invited @param {Uint8Array} token
   * @returns {Promise<Uint8Array>}
   */
  async sealInvited(invited, token) {
    const extension = invitationExtension(token, b64d(invited.leader_key_digest));
    const inLeader = this.invitation === 'leader';
    const config = (/** @type {{config_id: number, public_key: string}} */ c) => ({
      config_id: c.config_id,
      public_key: b64d(c.public_key),
    });
    return this.sealReport(
      invited.measurement,
      invited.time,
      b64d(invited.report_id),
      b64d(invited.rand),
      config(invited.leader),
      config(invited.helper),
      {
        publicExtensions: inLeader ? [] : [extension],
        leaderExtensions: inLeader ? [extension] : [],
        ephemerals: invited.ephemerals.map(b64d),
      },
    );
  }

  /**
   * The encoded Report of `sent` (a checked measurement, already through any
   * local layer) at `time` (in time precisions), sealed to `leader` and `helper`.
   * @param {unknown} sent @param {number} time @param {Uint8Array} reportId @param {Uint8Array} rand
   * @param {import('./hpke.js').HpkeConfig} leader @param {import('./hpke.js').HpkeConfig} helper
   * @param {{publicExtensions?: Extension[], leaderExtensions?: Extension[],
   *   ephemerals?: Uint8Array[]}} [options]
   */
  async sealReport(sent, time, reportId, rand, leader, helper, options = {}) {
    const { publicExtensions = [], leaderExtensions = [], ephemerals = [] } = options;
    const { publicShare, inputShares } = this.vdaf.shard(this.ctx, sent, reportId, rand);
    const ps = this.vdaf.encodePublicShare(publicShare);
    const metadata = encodeReportMetadata(reportId, time, publicExtensions);
    const aad = encodeInputShareAad(this.taskId, this.configuration, metadata, ps);
    const [leaderCt, helperCt] = await Promise.all(
      [
        [leader, ROLE_LEADER, inputShares[0], leaderExtensions, ephemerals[0]],
        [helper, ROLE_HELPER, inputShares[1], [], ephemerals[1]],
      ].map(([config, role, share, extensions, ephemeral]) =>
        seal(
          config,
          dapInputShareInfo(this.version, role),
          encodePlaintextInputShare(this.vdaf.encodeInputShare(share), extensions),
          aad,
          ephemeral,
        ),
      ),
    );
    return concat(metadata, opaque(ps, 4), encodeCiphertext(leaderCt), encodeCiphertext(helperCt));
  }
}

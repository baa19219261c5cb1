// Invitations in the browser: blind one token per question for the report
// already sealed for it, with @cloudflare/blindrsa-ts (RFC 9474,
// RSABSSA-SHA384-PSS-Deterministic), have the issuer sign them for the
// invitation (POST /invitation), and unblind. The tokens are veil.invite.token's:
// Privacy Pass token type 0x0002 (RFC 9578), token_type || nonce ||
// challenge_digest || token_key_id || authenticator, the challenge digest
// being SHA-256 of a TokenChallenge whose redemption_context commits to the
// sealed report: SHA-256("veil-invitation-report-v2" || task id || report id
// || time || SHA-256(public share) || SHA-256(leader's sealed share) ||
// SHA-256(helper's sealed share)), a sealed share being its config id,
// encapsulated key and payload. Whoever sees the token on the way cannot
// send another answer under it.

import { RSABSSA } from '@cloudflare/blindrsa-ts';
import { sha256 } from '@noble/hashes/sha2.js';

import { b64d, b64e } from './client.js';
import { concat } from './prio3.js';

const TOKEN_TYPE = new Uint8Array([0x00, 0x02]);
const LABEL = new TextEncoder().encode('veil-invitation-report-v2');
// A DAP report's (veil.dap.invitation.DAP_CONTEXT_LABEL).
const DAP_LABEL = new TextEncoder().encode('veil-invitation-dap-report-v1');
const NONCE_SIZE = 32;
// The TokenChallenge's issuer_name and origin_info (veil.invite.token).
const ISSUER_NAME = new TextEncoder().encode('issuer.veil.invalid');
const ORIGIN_INFO = new Uint8Array(0);
// The AlgorithmIdentifier of an RSASSA-PSS key (SHA-384, MGF1-SHA-384, salt
// 48), DER: what RFC 9578 section 6.5 puts in the SPKI its key id hashes.
const PSS_ALGORITHM = Uint8Array.from(
  ('303d06092a864886f70d01010a3030a00d300b0609608648016503040202' +
    'a11a301806092a864886f70d010108300b0609608648016503040202a203020130')
    .match(/../g)
    .map((h) => parseInt(h, 16)),
);
const KEYS_LABEL = new TextEncoder().encode('veil-issuer-keys-v1');

const hex = (/** @type {Uint8Array} */ bytes) =>
  Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');

const u16 = (/** @type {number} */ n) => new Uint8Array([n >> 8, n & 0xff]);

/** @param {number} n */
function derLength(n) {
  if (n < 0x80) return new Uint8Array([n]);
  const body = [];
  for (let m = n; m > 0; m = Math.floor(m / 256)) body.unshift(m & 0xff);
  return new Uint8Array([0x80 | body.length, ...body]);
}

/**
 * A DER element's end: the offset after the element starting at `at`.
 * @param {Uint8Array} der
 * @param {number} at
 */
function derEnd(der, at) {
  let len = der[at + 1];
  let head = 2;
  if (len & 0x80) {
    const n = len & 0x7f;
    len = 0;
    for (let i = 0; i < n; i++) len = len * 256 + der[at + 2 + i];
    head += n;
  }
  return at + head + len;
}

/**
 * The key as RFC 9578 section 6.5 encodes it: the SPKI's rsaEncryption
 * algorithm replaced by RSASSA-PSS's, the same RSAPublicKey bit string
 * (veil.invite.token.pss_public_key_bytes).
 * @param {Uint8Array} spki DER SubjectPublicKeyInfo, rsaEncryption
 */
export function pssPublicKey(spki) {
  const outer = spki[1] & 0x80 ? 2 + (spki[1] & 0x7f) : 2;
  const bitString = spki.subarray(derEnd(spki, outer), derEnd(spki, 0));
  const body = concat(PSS_ALGORITHM, bitString);
  return concat(new Uint8Array([0x30]), derLength(body.length), body);
}

/** RFC 9578's token_key_id: SHA-256 of the key's PSS SPKI. @param {Uint8Array} spki */
export function tokenKeyId(spki) {
  return sha256(pssPublicKey(spki));
}

/** @param {{config_id: number, enc: Uint8Array, payload: Uint8Array}} ct */
const sealedShareDigest = (ct) => sha256(concat(new Uint8Array([ct.config_id]), ct.enc, ct.payload));

/**
 * SHA-256(label || task id || report id || time || SHA-256(public share)
 * || leader's digest || helper's digest) (veil.invite.token.redemption_context).
 * @param {Uint8Array} label @param {Uint8Array} taskId @param {Uint8Array} reportId
 * @param {number} time seconds @param {Uint8Array} publicShare
 * @param {Uint8Array} leaderDigest @param {Uint8Array} helperDigest
 */
function bindingContext(label, taskId, reportId, time, publicShare, leaderDigest, helperDigest) {
  const t = new Uint8Array(8);
  new DataView(t.buffer).setBigUint64(0, BigInt(time));
  return sha256(
    concat(label, taskId, reportId, t, sha256(publicShare), leaderDigest, helperDigest),
  );
}

/**
 * The redemption context binding a token to one sealed report of one task
 * (veil.invite.token.report_context).
 * @param {Uint8Array} taskId
 * @param {import('./client.js').Report} report
 */
export function redemptionContext(taskId, report) {
  return bindingContext(
    LABEL,
    taskId,
    report.report_id,
    report.time,
    report.public_share,
    sealedShareDigest(report.leader_encrypted_input_share),
    sealedShareDigest(report.helper_encrypted_input_share),
  );
}

/**
 * The redemption context of a DAP report's token (veil.dap.invitation.
 * dap_redemption_context): the digests are of its shares' HPKE keys
 * (./dap.js, `sealedKeyDigest`), drawn before the shares are sealed.
 * @param {Uint8Array} taskId @param {Uint8Array} reportId @param {number} time seconds
 * @param {Uint8Array} publicShare @param {Uint8Array} leaderKeyDigest @param {Uint8Array} helperKeyDigest
 */
export function dapRedemptionContext(taskId, reportId, time, publicShare, leaderKeyDigest, helperKeyDigest) {
  return bindingContext(DAP_LABEL, taskId, reportId, time, publicShare, leaderKeyDigest, helperKeyDigest);
}

/**
 * SHA-256 of the TokenChallenge (RFC 9577 section 2.1) carrying `context`.
 * @param {Uint8Array} context 32 bytes
 */
export function challengeDigest(context) {
  return sha256(
    concat(
      TOKEN_TYPE,
      u16(ISSUER_NAME.length),
      ISSUER_NAME,
      new Uint8Array([context.length]),
      context,
      u16(ORIGIN_INFO.length),
      ORIGIN_INFO,
    ),
  );
}

/**
 * The fingerprint of a survey's issuer keys, as veil.invite.token.keys_fingerprint:
 * SHA-256 of "veil-issuer-keys-v1" and each key's id (SHA-256 of its SPKI),
 * in question order, as 64 hex digits.
 * @param {Uint8Array[]} spkis
 */
export function keysFingerprint(spkis) {
  return hex(sha256(concat(KEYS_LABEL, ...spkis.map((s) => sha256(s)))));
}

/**
 * The fingerprint of the issuer keys `questions` carry; InvitationError if
 * `published` (the survey's, e.g. from the link) is given and differs, so
 * that keys given to this respondent alone are never used.
 * @param {{issuer_public_key: string}[]} questions
 * @param {string | null | undefined} published
 */
export function checkIssuerKeys(questions, published) {
  const fingerprint = keysFingerprint(questions.map((q) => b64d(q.issuer_public_key)));
  if (published !== null && published !== undefined) {
    const want = published.replace(/[: -]/g, '').toLowerCase();
    if (want !== fingerprint) {
      throw new InvitationError(
        `This page's issuer keys (fingerprint ${fingerprint}) are not the ones your link` +
          ` names (${want}): keys given to you alone could mark your answers. Nothing was` +
          " sent and your invitation is unused; tell the survey's operator.",
      );
    }
  }
  return fingerprint;
}

/**
 * The RFC 9474 variant of every token, as RFC 9578 asks of token type
 * 0x0002 (js/test/rfc9474.test.js holds it to the RFC's vector).
 */
export function tokenSuite() {
  return RSABSSA.SHA384.PSS.Deterministic();
}

/** The issuer refused the invitation; `message` is the issuer's. */
export class InvitationError extends Error {
  constructor(message) {
    super(message);
    this.name = 'InvitationError';
  }
}

/**
 * Blind one token per task for its sealed report, or for the redemption
 * context given (`{context}`, base64url: a DAP report's, whose token is
 * sealed inside it, ./dap.js `prepareInvited`), null for a question left
 * unanswered (the issuer signs one token per question, and that one is bound
 * to nothing): the state to keep (as JSON, e.g. in sessionStorage, with the
 * reports) until the issuer answered, so that a retry sends the very same
 * blinded messages and gets the same signatures back.
 * @param {{task_id: string, issuer_public_key: string}[]} tasks
 * @param {(import('./client.js').Report | {context: string} | null)[]} reports
 * @param {{randomBytes?: (n: number) => Uint8Array}} [options]
 * @returns {Promise<Record<string, string>[]>}
 */
export async function prepareInvitation(tasks, reports, options = {}) {
  const randomBytes =
    options.randomBytes ?? ((n) => globalThis.crypto.getRandomValues(new Uint8Array(n)));
  if (reports.length !== tasks.length) throw new RangeError('one report (or null) per task');
  const suite = tokenSuite();
  const pending = [];
  for (const [i, task] of tasks.entries()) {
    const spki = b64d(task.issuer_public_key);
    const key = await importKey(spki);
    const report = reports[i];
    const context =
      report === null
        ? randomBytes(32)
        : 'context' in report
          ? b64d(report.context)
          : redemptionContext(b64d(task.task_id), report);
    const digest = challengeDigest(context);
    const keyId = tokenKeyId(spki);
    const nonce = randomBytes(NONCE_SIZE);
    const { blindedMsg, inv } = await suite.blind(key, concat(TOKEN_TYPE, nonce, digest, keyId));
    pending.push({
      spki: task.issuer_public_key,
      nonce: b64e(nonce),
      digest: b64e(digest),
      keyId: b64e(keyId),
      blindedMsg: b64e(blindedMsg),
      inv: b64e(inv),
    });
  }
  return pending;
}

/** @param {Uint8Array} spki */
function importKey(spki) {
  return globalThis.crypto.subtle.importKey(
    'spki', spki, { name: 'RSA-PSS', hash: 'SHA-384' }, true, ['verify'],
  );
}

/**
 * Redeem `code` for the blinded tokens of `prepareInvitation`, and unblind:
 * the tokens, in the same order.
 * @param {string} url the issuer's POST /invitation
 * @param {string} code
 * @param {Record<string, string>[]} pending
 * @param {{fetch?: typeof fetch}} [options]
 * @returns {Promise<Uint8Array[]>}
 */
export async function finishInvitation(url, code, pending, options = {}) {
  const doFetch = options.fetch ?? globalThis.fetch;
  const suite = tokenSuite();
  const response = await doFetch(url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ invitation: code, blinded: pending.map((p) => p.blindedMsg) }),
  });
  const answer = await response.json();
  if (!response.ok) throw new InvitationError(String(answer.error ?? `HTTP ${response.status}`));
  const sigs = answer.blind_signatures;
  if (!Array.isArray(sigs) || sigs.length !== pending.length) {
    throw new InvitationError("the issuer's answer is malformed");
  }
  const out = [];
  for (const [i, p] of pending.entries()) {
    const message = concat(TOKEN_TYPE, b64d(p.nonce), b64d(p.digest), b64d(p.keyId));
    const sig = await suite.finalize(await importKey(b64d(p.spki)), message, b64d(sigs[i]), b64d(p.inv));
    out.push(concat(message, sig));
  }
  return out;
}

/**
 * Each of `reports` (one per task, in order; null for a question left
 * unanswered) with its token, for invitation `code`.
 * @param {string} url the issuer's POST /invitation
 * @param {string} code
 * @param {{task_id: string, issuer_public_key: string}[]} tasks
 * @param {(import('./client.js').Report | null)[]} reports
 * @param {{fetch?: typeof fetch, randomBytes?: (n: number) => Uint8Array}} [options]
 */
export async function redeemInvitation(url, code, tasks, reports, options = {}) {
  const tokens = await finishInvitation(
    url,
    code,
    await prepareInvitation(tasks, reports, options),
    options,
  );
  return reports.map((r, i) => (r === null ? null : { ...r, token: tokens[i] }));
}

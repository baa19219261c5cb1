// Invitations in the browser: pick each question's report id, blind one
// token per question with @cloudflare/blindrsa-ts (RFC 9474,
// RSABSSA-SHA384-PSS-Randomized), have the issuer sign them for the
// invitation (POST /invitation), and unblind. The same token format as
// veil.invite.token: token_type 0x0002 || nonce || context || key id ||
// authenticator, the nonce being the randomized variant's prefix and the
// context SHA-256("veil-invitation-token-v1" || task id || report id).

import { RSABSSA } from '@cloudflare/blindrsa-ts';
import { sha256 } from '@noble/hashes/sha2.js';

import { REPORT_ID_SIZE, b64d, b64e } from './client.js';
import { concat } from './prio3.js';

const TOKEN_TYPE = new Uint8Array([0x00, 0x02]);
const LABEL = new TextEncoder().encode('veil-invitation-token-v1');
const NONCE_SIZE = 32;
const KEYS_LABEL = new TextEncoder().encode('veil-issuer-keys-v1');

const hex = (/** @type {Uint8Array} */ bytes) =>
  Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');

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
 * The RFC 9474 variant of every token: the only one veil implements
 * (js/test/rfc9474.test.js holds it to the RFC's vector).
 */
export function tokenSuite() {
  return RSABSSA.SHA384.PSS.Randomized();
}

/** The issuer refused the invitation; `message` is the issuer's. */
export class InvitationError extends Error {
  constructor(message) {
    super(message);
    this.name = 'InvitationError';
  }
}

/**
 * Blind one token per task, choosing each report id: the state to keep (as
 * JSON, e.g. in sessionStorage) until the issuer answered, so that a retry
 * sends the very same blinded messages and gets the same signatures back.
 * @param {{task_id: string, issuer_public_key: string}[]} tasks
 * @param {{randomBytes?: (n: number) => Uint8Array}} [options]
 * @returns {Promise<Record<string, string>[]>}
 */
export async function prepareInvitation(tasks, options = {}) {
  const randomBytes =
    options.randomBytes ?? ((n) => globalThis.crypto.getRandomValues(new Uint8Array(n)));
  const suite = tokenSuite();
  const pending = [];
  for (const task of tasks) {
    const spki = b64d(task.issuer_public_key);
    const key = await importKey(spki);
    const reportId = randomBytes(REPORT_ID_SIZE);
    const context = sha256(concat(LABEL, b64d(task.task_id), reportId));
    const keyId = sha256(spki);
    const nonce = randomBytes(NONCE_SIZE);
    const { blindedMsg, inv } = await suite.blind(key, concat(nonce, TOKEN_TYPE, context, keyId));
    pending.push({
      spki: task.issuer_public_key,
      reportId: b64e(reportId),
      nonce: b64e(nonce),
      context: b64e(context),
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
 * Redeem `code` for the blinded tokens of `prepareInvitation`, and unblind.
 * @param {string} url the issuer's POST /invitation
 * @param {string} code
 * @param {Record<string, string>[]} pending
 * @param {{fetch?: typeof fetch}} [options]
 * @returns {Promise<{reportId: Uint8Array, token: Uint8Array}[]>}
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
    const [nonce, context, keyId] = [b64d(p.nonce), b64d(p.context), b64d(p.keyId)];
    const message = concat(nonce, TOKEN_TYPE, context, keyId);
    const sig = await suite.finalize(await importKey(b64d(p.spki)), message, b64d(sigs[i]), b64d(p.inv));
    out.push({ reportId: b64d(p.reportId), token: concat(TOKEN_TYPE, nonce, context, keyId, sig) });
  }
  return out;
}

/**
 * One {reportId, token} per task, in order, for invitation `code`.
 * @param {string} url the issuer's POST /invitation
 * @param {string} code
 * @param {{task_id: string, issuer_public_key: string}[]} tasks
 * @param {{fetch?: typeof fetch, randomBytes?: (n: number) => Uint8Array}} [options]
 */
export async function redeemInvitation(url, code, tasks, options = {}) {
  return finishInvitation(url, code, await prepareInvitation(tasks, options), options);
}

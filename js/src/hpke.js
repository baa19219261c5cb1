// HPKE sealing of input shares (RFC 9180, base mode; veil.hpke), with the
// one suite of veil and DAP: DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 /
// AES-128-GCM.
//
// Library: @hpke/core (hpke-js), checked on the npm registry (1.9.0, MIT,
// ~900k downloads a month, one dependency of its own family, @hpke/common).
// It implements RFC 9180 in full and is tested against the RFC's vectors; its
// X25519, HKDF and AES-GCM are the runtime's WebCrypto (browsers and node >=
// 20), so no curve or cipher code is shipped in the bundle and none is written
// here. The alternative, @noble/curves + @noble/ciphers, would have left the
// HPKE key schedule for us to write by hand.
//
// veil's Python side (cryptography's single-shot HPKE) takes no AEAD
// associated data, so the DAP associated data is appended to a fixed label and
// carried in `info`, which enters the key schedule: a share opened with any
// other context fails exactly as with a wrong aad. The AEAD aad stays empty.

import { Aes128Gcm, CipherSuite, DhkemX25519HkdfSha256, HkdfSha256 } from '@hpke/core';

export const KEM_ID_X25519_HKDF_SHA256 = 0x0020;
export const KDF_ID_HKDF_SHA256 = 0x0001;
export const AEAD_ID_AES_128_GCM = 0x0001;
export const PUBLIC_KEY_SIZE = 32;

export const ROLE_COLLECTOR = 0;
export const ROLE_CLIENT = 1;
export const ROLE_LEADER = 2;
export const ROLE_HELPER = 3;

const INPUT_SHARE_LABEL = new TextEncoder().encode('veil-v1 input share');

/** A public HPKE key with its identifier (DAP "HpkeConfig"). @typedef {{
 *   config_id: number, public_key: Uint8Array,
 *   kem_id?: number, kdf_id?: number, aead_id?: number}} HpkeConfig */

/** @typedef {{config_id: number, enc: Uint8Array, payload: Uint8Array}} Ciphertext */

/** An HPKE config this client cannot use, or a failure to seal. */
export class HpkeError extends Error {
  constructor(message) {
    super(message);
    this.name = 'HpkeError';
  }
}

/** @type {CipherSuite | null} */
let suite = null;

function theSuite() {
  suite ??= new CipherSuite({
    kem: new DhkemX25519HkdfSha256(),
    kdf: new HkdfSha256(),
    aead: new Aes128Gcm(),
  });
  return suite;
}

/** @param {HpkeConfig} config */
export function isSupported(config) {
  return (
    (config.kem_id ?? KEM_ID_X25519_HKDF_SHA256) === KEM_ID_X25519_HKDF_SHA256 &&
    (config.kdf_id ?? KDF_ID_HKDF_SHA256) === KDF_ID_HKDF_SHA256 &&
    (config.aead_id ?? AEAD_ID_AES_128_GCM) === AEAD_ID_AES_128_GCM
  );
}

/**
 * The ephemeral key pair of a raw X25519 private key (32 bytes), as hpke-js
 * takes one: for a seal whose encapsulated key the caller must know first
 * (an invitation token over DAP commits to it, veil.hpke.new_ephemeral).
 * @param {Uint8Array} privateKey
 */
async function ephemeralPair(privateKey) {
  if (privateKey.length !== PUBLIC_KEY_SIZE) {
    throw new HpkeError(`an ephemeral X25519 key is ${PUBLIC_KEY_SIZE} bytes`);
  }
  const kem = theSuite().kem;
  const sk = await kem.deserializePrivateKey(privateKey);
  const pk = await kem.deserializePublicKey(await x25519Public(sk));
  return { privateKey: sk, publicKey: pk };
}

/**
 * The X25519 public key of a private CryptoKey: its JWK's `x`, or, where a
 * browser does not export it (hpke-js meets this in Firefox), the key's
 * product with the base point.
 * @param {CryptoKey} sk
 */
async function x25519Public(sk) {
  try {
    const jwk = await globalThis.crypto.subtle.exportKey('jwk', sk);
    const bin = atob(String(jwk.x).replace(/-/g, '+').replace(/_/g, '/'));
    return Uint8Array.from(bin, (c) => c.charCodeAt(0));
  } catch {
    const base = new Uint8Array(PUBLIC_KEY_SIZE);
    base[0] = 9;
    const point = await globalThis.crypto.subtle.importKey('raw', base, { name: 'X25519' }, true, []);
    const bits = await globalThis.crypto.subtle.deriveBits({ name: 'X25519', public: point }, sk, 256);
    return new Uint8Array(bits);
  }
}

/**
 * The encapsulated key (`enc`) a seal with ephemeral private key
 * `privateKey` writes: its X25519 public key.
 * @param {Uint8Array} privateKey 32 bytes
 */
export async function ephemeralEnc(privateKey) {
  const { publicKey } = await ephemeralPair(privateKey);
  return new Uint8Array(await theSuite().kem.serializePublicKey(publicKey));
}

/**
 * Seal `plaintext` to `config` with `info` as the context (base mode), and
 * `aad` as the AEAD's associated data: empty for veil's own reports, DAP's
 * InputShareAad for a DAP report (./dap.js). `ephemeral`, a raw X25519
 * private key, where the caller drew it (see `ephemeralEnc`); a fresh one
 * otherwise.
 * @param {HpkeConfig} config @param {Uint8Array} info @param {Uint8Array} plaintext
 * @param {Uint8Array} [aad] @param {Uint8Array} [ephemeral]
 * @returns {Promise<Ciphertext>}
 */
export async function seal(config, info, plaintext, aad = new Uint8Array(0), ephemeral = undefined) {
  if (!isSupported(config)) {
    throw new HpkeError(`HPKE config ${config.config_id} uses an unsupported suite`);
  }
  if (!Number.isInteger(config.config_id) || config.config_id < 0 || config.config_id > 255) {
    throw new HpkeError(`HPKE config id ${config.config_id} is outside 0..255`);
  }
  if (config.public_key.length !== PUBLIC_KEY_SIZE) {
    throw new HpkeError(`HPKE public key must be ${PUBLIC_KEY_SIZE} bytes`);
  }
  const s = theSuite();
  const recipientPublicKey = await s.kem.deserializePublicKey(config.public_key);
  // hpke-js takes a caller's ephemeral key pair as `ekm` (meant for tests).
  // Here it is randomness the caller drew for one invited report (./dap.js
  // prepareInvited), whose token commits to its `enc` before the report is
  // sealed. A retry or a reload seals that report again with the same key:
  // safe, because it seals the same plaintext with the same info and
  // associated data (the report's content is kept and its token is
  // deterministic: the issuer signs the same blinded message alike, and
  // finalizing gives the same token), so the same key and nonce give the
  // same ciphertext and a second seal reveals nothing. Other content must
  // never be sealed under a key used once: that would reuse the AEAD's nonce.
  const ekm = ephemeral === undefined ? undefined : await ephemeralPair(ephemeral);
  const { ct, enc } = await s.seal({ recipientPublicKey, info, ekm }, plaintext, aad);
  return { config_id: config.config_id, enc: new Uint8Array(enc), payload: new Uint8Array(ct) };
}

/**
 * Context of an input share sealed by a client to `serverRole` (veil.hpke.input_share_info):
 * label || client role || server role || task id (32) || report id (16) ||
 * time (8, big-endian) || public share. The sizes before the public share are
 * fixed, so the encoding is injective.
 * @param {number} serverRole @param {Uint8Array} taskId @param {Uint8Array} reportId
 * @param {number} time seconds since the epoch @param {Uint8Array} publicShare
 */
export function inputShareInfo(serverRole, taskId, reportId, time, publicShare) {
  const head = INPUT_SHARE_LABEL.length;
  const out = new Uint8Array(head + 2 + taskId.length + reportId.length + 8 + publicShare.length);
  out.set(INPUT_SHARE_LABEL, 0);
  out[head] = ROLE_CLIENT;
  out[head + 1] = serverRole;
  let offset = head + 2;
  out.set(taskId, offset);
  offset += taskId.length;
  out.set(reportId, offset);
  offset += reportId.length;
  new DataView(out.buffer).setBigUint64(offset, BigInt(time));
  out.set(publicShare, offset + 8);
  return out;
}

// veil's client for browsers and node: the modules mirror veil.vdaf (field,
// xof, poly, gadgets, circuits, flp, prio3; idpf and poplar1 for text
// answers), veil.hpke and veil.client, and dap (veil.dap.report) for a DAP
// task's reports.

export { CodecError, Field, Field64, Field128, Field255 } from './field.js';
export { XofFixedKeyAes128, XofTurboShake128 } from './xof.js';
export { IdpfBBCGGI21 } from './idpf.js';
export { Poplar1 } from './poplar1.js';
export { MAX_TEXT_BYTES, TextAnswerError, encodeTextAnswer } from './text.js';
export { MeasurementError } from './circuits.js';
export {
  Prio3,
  Prio3Count,
  Prio3Histogram,
  Prio3L1BoundSum,
  Prio3MultihotCountVec,
  Prio3Sum,
  Prio3SumVec,
  Prio3SumVecWithMultiproof,
  prio3FromSpec,
} from './prio3.js';
export { HpkeError, ROLE_HELPER, ROLE_LEADER, inputShareInfo, seal } from './hpke.js';
export {
  Client,
  b64d,
  b64e,
  hpkeConfigFromJson,
  reportToJson,
  usableConfig,
} from './client.js';
export {
  DAP_VERSIONS,
  DapClient,
  dapInputShareInfo,
  dapVdafContext,
  encodeInputShareAad,
  encodeReportMetadata,
} from './dap.js';
export {
  InvitationError,
  finishInvitation,
  prepareInvitation,
  redeemInvitation,
} from './invite.js';

// The survey page's script (bundled by scripts/build.mjs into
// src/veil/web/static/veil-survey.js; `veil survey serve` serves it with
// Subresource Integrity). It reads the answers from the form that the server
// rendered, checks them, shards and seals each one on this device with the
// Prio3 client (as DAP reports, ./dap.js, for a survey deployed over DAP),
// and posts only the sealed reports: the server never sees an
// answer.

import { MeasurementError } from './circuits.js';
import { Client, b64e, hpkeConfigFromJson, reportToJson, usableConfig } from './client.js';
import { DapClient } from './dap.js';
import {
  InvitationError,
  checkIssuerKeys,
  finishInvitation,
  prepareInvitation,
} from './invite.js';
import { localChannel } from './local.js';
import { TextAnswerError, encodeTextAnswer } from './text.js';

/**
 * A question of the public survey description (veil.survey.public_description),
 * with the `vdaf` of its task file added by the server.
 * @typedef {{id: string, text: string, kind: string, task_id: string,
 *   vdaf: {type: string}, dp?: {local_epsilon?: string, local_max_choices?: number},
 *   options?: string[], max_choices?: number, max?: number,
 *   length?: number, labels?: string[], required?: boolean, total?: number,
 *   max_bytes?: number, case_sensitive?: boolean}} Question
 */

/**
 * A breakdown of the public survey description: question `question` counted in
 * each group of question `by`, with the `vdaf` of its task file added by the server.
 * @typedef {{id: string, question: string, by: string, task_id: string,
 *   vdaf: {type: string}}} Breakdown
 */

/**
 * A breakdown's measurement from its two questions' measurements (as readAnswer
 * gives them; null for a question left out), as veil.survey.Question's
 * breakdown_measurement makes it: the cell group x category of a histogram for a
 * yes/no or single choice, the group's row of a multihot vector for a multiple
 * choice or of an L1-bound sum for a points split, the group's entry of an
 * L1-bound sum for a number; for a randomized multiple choice or number, the
 * group's row of its bits and a last 1 (a multihot vector). Null unless both
 * questions are answered.
 * @param {Breakdown} b @param {Question[]} questions @param {any[]} answers
 */
export function breakdownMeasurement(b, questions, answers) {
  const i = questions.findIndex((q) => q.id === b.question);
  const j = questions.findIndex((q) => q.id === b.by);
  if (i < 0 || j < 0) throw new Error(`breakdown ${b.id}: no such questions`);
  const answer = answers[i];
  if (answer === null || answers[j] === null) return null;
  const of = questions[i];
  const by = questions[j];
  const groups = by.kind === 'yes_no' ? 2 : (by.options ?? []).length;
  const group = Number(answers[j]);
  /** @param {any[]} row @param {any} zero */
  const inRow = (row, zero) =>
    Array.from({ length: groups }, (_, g) => (g === group ? row : row.map(() => zero))).flat();
  if (of.dp?.local_epsilon != null && (of.kind === 'multi_choice' || of.kind === 'integer')) {
    // A randomized multiple choice's bits, or a number's one (drawn as max or 0),
    // then 1: the group's count, which de-biasing its cells needs.
    const bits = of.kind === 'multi_choice' ? answer.map(Boolean) : [Number(answer) !== 0];
    return inRow([...bits, true], false);
  }
  switch (of.kind) {
    case 'yes_no':
      return group * 2 + Number(answer);
    case 'choice':
      return group * (of.options ?? []).length + Number(answer);
    case 'multi_choice':
      return inRow(answer, false);
    case 'points':
      return inRow(answer, 0);
    case 'integer':
      return inRow([answer], 0);
    default:
      throw new Error(`breakdown ${b.id}: a ${of.kind} question is not broken down`);
  }
}

/** An answer the respondent must change; the message is shown by the question. */
class AnswerError extends Error {}

/** Sending failed; the message is for the respondent (no server wording, no ids). */
class SendError extends Error {}

/**
 * What a respondent is told for an HTTP status of this server (its own
 * wording, meant for programs, goes to the console only).
 * @param {number} status
 */
export function statusMessage(status) {
  if (status === 429) return 'Too many answers came from your network just now. Try again in a minute.';
  if (status === 503 || status === 502 || status === 504) {
    return 'The survey is busy or briefly unavailable. Try again in a moment.';
  }
  if (status === 409) {
    return 'The survey could not take these answers: it may have closed. Reload the page to see.';
  }
  if (status >= 400 && status < 500) {
    return 'This page could not send your answers. Reload the page and answer again.';
  }
  return 'Your answers could not be sent. Try again in a moment.';
}

/** @param {number} ms */
function when(ms) {
  return new Date(ms).toLocaleString(undefined, { dateStyle: 'long', timeStyle: 'short' });
}

/**
 * Why the survey cannot be answered now, in plain words, or null when it is open.
 * @param {HTMLFormElement} form @param {number} now milliseconds since the epoch
 */
export function windowMessage(form, now) {
  const opens = Number(form.dataset.opens ?? 'NaN');
  const closes = Number(form.dataset.closes ?? 'NaN');
  if (now < opens) return `This survey opens on ${when(opens)}.`;
  if (now >= closes) return `This survey closed on ${when(closes)}.`;
  return null;
}

/**
 * The measurement of one question from the form's controls; null when it was
 * left unanswered (nothing chosen, nothing typed), which a required question
 * refuses; AnswerError for an answer that does not fit.
 * @param {HTMLFormElement} form @param {Question} q
 */
export function readAnswer(form, q) {
  const controls = /** @type {NodeListOf<HTMLInputElement>} */ (
    form.querySelectorAll(`[name="${q.id}"]`)
  );
  const checked = [...controls].filter((c) => c.checked);
  const empty =
    q.kind === 'integer' || q.kind === 'vector' || q.kind === 'text' || q.kind === 'points'
      ? [...controls].every((c) => c.value.trim() === '')
      : checked.length === 0;
  // A multiple choice with nothing chosen is the answer "none of these" when
  // an answer is needed; otherwise it is left out like any other question.
  if (empty && !(q.required && q.kind === 'multi_choice')) {
    if (q.required) throw new AnswerError('This question needs an answer.');
    return null;
  }
  switch (q.kind) {
    case 'yes_no':
      if (checked.length !== 1) throw new AnswerError('Choose yes or no.');
      return checked[0].value === 'yes' ? 1 : 0;
    case 'choice':
      if (checked.length !== 1) throw new AnswerError('Choose one option.');
      return Number(checked[0].dataset.index);
    case 'multi_choice': {
      const max = q.max_choices ?? 0;
      if (checked.length > max) {
        throw new AnswerError(`Choose at most ${max} (${checked.length} chosen).`);
      }
      return [...controls].map((c) => c.checked);
    }
    case 'integer':
      return wholeNumber(controls[0].value, q.max ?? 0);
    case 'vector':
      return [...controls].map((c) => wholeNumber(c.value, q.max ?? 0));
    case 'text':
      return textAnswer(controls[0].value, q);
    case 'points':
      return pointsAnswer([...controls].map((c) => c.value), q.total ?? 0);
    default:
      throw new AnswerError(`This page cannot answer a question of kind ${q.kind}.`);
  }
}

/**
 * A text answer normalised (NFC, trimmed, lower-cased unless case-sensitive) and
 * encoded as its Poplar1 bits, exactly as `veil survey respond` does.
 * @param {string} text @param {Question} q
 */
function textAnswer(text, q) {
  try {
    return encodeTextAnswer(text, {
      maxBytes: q.max_bytes ?? 0,
      caseSensitive: q.case_sensitive ?? false,
      bits: /** @type {any} */ (q.vdaf).bits,
    }).measurement;
  } catch (e) {
    if (!(e instanceof TextAnswerError)) throw e;
    if (e.code === 'too_long') {
      throw new AnswerError(
        `This answer is too long: at most ${q.max_bytes} bytes (a letter outside A to Z` +
          ' may take 2 to 4). Shorten it.',
      );
    }
    throw new AnswerError(
      e.code === 'empty' ? 'This question needs an answer.' : 'This answer cannot be sent as typed.',
    );
  }
}

/**
 * The points typed for each option (an empty box is 0) and their sum, or null
 * when some box does not hold a whole number.
 * @param {string[]} texts
 */
export function pointsGiven(texts) {
  const points = [];
  for (const text of texts) {
    const t = text.trim();
    if (t === '') points.push(0);
    else if (/^\d{1,15}$/.test(t)) points.push(Number(t));
    else return null;
  }
  return { points, sum: points.reduce((a, b) => a + b, 0) };
}

/**
 * A points answer: one whole number per option (an empty box is 0), adding up
 * to at most `total`, as `veil survey respond` checks it.
 * @param {string[]} texts @param {number} total
 */
export function pointsAnswer(texts, total) {
  const given = pointsGiven(texts);
  if (given === null) {
    throw new AnswerError(`Give each option a whole number of points (0 to ${total}).`);
  }
  if (given.sum > total) {
    throw new AnswerError(
      `These add up to ${given.sum} points, over the ${total} you have: take ${given.sum - total} off.`,
    );
  }
  return given.points;
}

/**
 * What a points question's running total says, and whether it is over.
 * @param {string[]} texts @param {number} total
 */
export function pointsTotalMessage(texts, total) {
  const given = pointsGiven(texts);
  if (given === null) return { text: `Points are whole numbers, 0 to ${total}.`, over: false };
  if (given.sum > total) {
    return {
      text: `${given.sum} of ${total} points given: ${given.sum - total} too many.`,
      over: true,
    };
  }
  return { text: `${given.sum} of ${total} points given.`, over: false };
}

/** @param {HTMLElement} box a points question's fieldset */
function showPointsTotal(box) {
  const line = /** @type {HTMLElement | null} */ (box.querySelector('.points-total'));
  if (line === null) return;
  const inputs = /** @type {NodeListOf<HTMLInputElement>} */ (box.querySelectorAll('input'));
  const { text, over } = pointsTotalMessage(
    [...inputs].map((c) => c.value),
    Number(line.dataset.total),
  );
  // Only a change is written, so that the live region speaks once per change.
  if (line.textContent !== text) line.textContent = text;
  line.classList.toggle('over', over);
}

/** @param {string} text @param {number} max */
function wholeNumber(text, max) {
  const t = text.trim();
  if (!/^\d{1,15}$/.test(t) || Number(t) > max) {
    throw new AnswerError(`Give a whole number from 0 to ${max}.`);
  }
  return Number(t);
}

/** @param {string} url */
async function getJson(url) {
  const response = await reach(url, { headers: { Accept: 'application/json' } });
  if (!response.ok) {
    console.error(url, response.status, await response.text());
    throw new SendError(statusMessage(response.status));
  }
  return response.json();
}

/** fetch, with a failure to reach the server said in plain words.
 * @param {string} url @param {RequestInit} init */
async function reach(url, init) {
  try {
    return await fetch(url, init);
  } catch (e) {
    console.error(url, e);
    throw new SendError('Could not reach the survey server. Check your connection and try again.');
  }
}

/** @param {HTMLFormElement} form @param {string} message */
function closeForm(form, message) {
  form.dataset.window = 'closed';
  for (const control of form.querySelectorAll('input, button')) {
    /** @type {HTMLInputElement} */ (control).disabled = true;
  }
  const status = document.getElementById('status');
  if (status !== null) status.textContent = message;
}

/** @param {HTMLElement} box @param {string} message */
function showError(box, message) {
  const error = /** @type {HTMLElement} */ (box.querySelector('.error'));
  error.textContent = message;
  error.hidden = !message;
  for (const input of box.querySelectorAll('input')) {
    if (message) input.setAttribute('aria-invalid', 'true');
    else input.removeAttribute('aria-invalid');
  }
}

async function main() {
  const form = /** @type {HTMLFormElement | null} */ (document.getElementById('survey'));
  const status = document.getElementById('status');
  if (form === null || status === null) return;
  const say = (/** @type {string} */ text) => {
    status.textContent = text;
  };
  const shut = windowMessage(form, Date.now());
  if (shut !== null) {
    closeForm(form, shut);
    return;
  }
  if (!globalThis.crypto?.subtle) {
    say('This page must be opened over HTTPS: your browser encrypts the answers only there.');
    return;
  }
  try {
    // HPKE here is WebCrypto's X25519 (browsers since 2024-2025): find out now,
    // not after the respondent has answered.
    await crypto.subtle.generateKey({ name: 'X25519' }, false, ['deriveBits']);
  } catch {
    say('This browser cannot encrypt the answers (no X25519): please use a current browser.');
    return;
  }
  /** @type {{questions: Question[], time_precision: number} | null} */
  let survey = null;
  // A survey with invitations: the code comes in the link's #fragment, which
  // the browser never sends to a server.
  const fragment = new URLSearchParams(location.hash.slice(1));
  const invitation = fragment.get('invitation');
  // The fingerprint of the survey's issuer keys as published (links carry it).
  const publishedKeys = fragment.get('keys');
  // The sealed reports (with their tokens) stay in this tab's sessionStorage
  // until the server acknowledged them all: a retry, or a reload, sends the
  // very same reports, which the leader acknowledges as duplicates.
  const storeKey = `veil-sealed:${location.pathname}`;
  /** @type {unknown[] | null} reports already built, sent again as they are on a retry */
  let sealed = JSON.parse(sessionStorage.getItem(storeKey) ?? 'null');
  // Another link opened in this tab (a second invitation, say) changes only the
  // fragment: start again from it rather than keep the last one's "Thank you".
  window.addEventListener('hashchange', () => location.reload());
  // By invitation and no code in the link: say so now, not once the form is filled in.
  if (form.dataset.invitations !== undefined && !invitation && sealed === null) {
    closeForm(form, 'This survey is by invitation: open the link you were given.');
    form.dataset.ready = 'true';
    return;
  }
  // By invitation: the issuer keys this page serves, checked against the
  // link's fingerprint and shown, before anything is filled in.
  if (form.dataset.invitations !== undefined && sealed === null) {
    try {
      survey = await getJson('survey.json');
      const fingerprint = checkIssuerKeys(
        /** @type {any} */ ([...survey.questions, ...(survey.breakdowns ?? [])]),
        publishedKeys,
      );
      const shown = document.getElementById('issuer-keys');
      if (shown !== null) {
        shown.textContent = `Issuer keys fingerprint: ${fingerprint}`;
        shown.hidden = false;
      }
    } catch (e) {
      if (e instanceof InvitationError) {
        closeForm(form, e.message);
        form.dataset.ready = 'true';
        return;
      }
      // Unreachable for now: checked again when the answers are sent.
      console.error(e);
      survey = null;
    }
  }

  form.addEventListener('input', (event) => {
    const box = /** @type {HTMLElement} */ (event.target).closest('.question');
    if (box) showError(/** @type {HTMLElement} */ (box), '');
    if (box && /** @type {HTMLElement} */ (box).dataset.kind === 'points') {
      showPointsTotal(/** @type {HTMLElement} */ (box));
    }
  });
  // A box emptied by a script or an autofill may fire no input event: the total
  // follows its change too.
  form.addEventListener('change', (event) => {
    const box = /** @type {HTMLElement} */ (event.target).closest('.question');
    if (box && /** @type {HTMLElement} */ (box).dataset.kind === 'points') {
      showPointsTotal(/** @type {HTMLElement} */ (box));
    }
  });

  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const button = /** @type {HTMLButtonElement} */ (form.querySelector('button[type=submit]'));
    const shut = windowMessage(form, Date.now());
    if (shut !== null) {
      closeForm(form, shut);
      return;
    }
    button.disabled = true;
    try {
      survey ??= await getJson('survey.json');
      const {
        questions,
        breakdowns = [],
        time_precision: timePrecision,
        invitations,
      } = /** @type {{questions: Question[], breakdowns?: Breakdown[], time_precision: number,
        invitations?: boolean}} */ (survey);
      // Every task, in the order of the survey's issuer keys: the questions, then
      // the breakdowns (answered from the questions' answers, nothing more asked).
      /** @type {(Question | Breakdown)[]} */
      const tasks = [...questions, ...breakdowns];
      if (sealed === null && invitations && !invitation) {
        say('This survey is by invitation: open the link you were given.');
        return;
      }
      if (sealed === null) {
        const answers = [];
        /** @type {HTMLElement | null} */
        let firstBad = null;
        for (const q of questions) {
          const box = /** @type {HTMLElement} */ (document.getElementById(`q-${q.id}`));
          try {
            answers.push(readAnswer(form, q));
            showError(box, '');
          } catch (e) {
            if (!(e instanceof AnswerError)) throw e;
            showError(box, e.message);
            firstBad ??= box;
          }
        }
        if (firstBad !== null) {
          say('Some answers need a change: see the messages above.');
          firstBad.querySelector('input')?.focus();
          return;
        }
        if (answers.every((a) => a === null)) {
          say('Answer at least one question: nothing was sent.');
          return;
        }
        // An answer with a local layer is randomized here, once: its question's
        // report and its breakdowns send that one draw (the true answer goes no further).
        const random = (/** @type {number} */ n) => crypto.getRandomValues(new Uint8Array(n));
        const drawn = questions.map((q, i) => answers[i] !== null && q.dp?.local_epsilon != null);
        for (let i = 0; i < questions.length; i++) {
          if (drawn[i]) answers[i] = localChannel(questions[i].vdaf, questions[i].dp, random)?.(answers[i]);
        }
        for (const b of breakdowns) answers.push(breakdownMeasurement(b, questions, answers));
        const pendingKey = `veil-invitation:${location.pathname}:${invitation}`;
        if (invitations && invitation) checkIssuerKeys(/** @type {any} */ (tasks), publishedKeys);
        // By invitation: the reports sealed, then a token asked for each as
        // sealed (its challenge commits to the report's content), both kept
        // until the issuer answered: a retry after a lost answer sends the
        // same blinded tokens, gets the same signatures, and sends the
        // reports they were made for (the answers as first sent). Over DAP
        // the token is sealed inside its report, so what is kept until then
        // is what the report is built from: the answer as sent (after any
        // local layer), its randomness and keys, never the true answer of a
        // randomized question.
        /** @type {{reports: (Record<string, unknown> | null)[], pending: Record<string, string>[]} | null} */
        let kept =
          invitations && invitation ? JSON.parse(sessionStorage.getItem(pendingKey) ?? 'null') : null;
        if (kept === null) {
          say('Encrypting your answers on this device…');
          const configs = await getJson('hpke-configs.json');
          /** @type {(import('./client.js').Report | Uint8Array | import('./dap.js').InvitedReport | null)[]} */
          const built = [];
          for (let i = 0; i < tasks.length; i++) {
            const q = /** @type {Question} */ (tasks[i]);
            if (answers[i] === null) {
              built.push(null); // skipped: no report for it
              continue;
            }
            const c = configs[q.task_id];
            // Drawn above: not randomized a second time.
            const task = { task_id: q.task_id, vdaf: q.vdaf, time_precision: timePrecision, dp: drawn[i] ? undefined : q.dp };
            const sealTo = {
              leader: usableConfig(c.leader.map(hpkeConfigFromJson)),
              helper: usableConfig(c.helper.map(hpkeConfigFromJson)),
            };
            // A survey deployed over DAP: the draft's Report, relayed as a DAP upload.
            const dap = /** @type {any} */ (q).dap;
            if (dap && invitations && invitation) {
              // Its token goes inside what its shares are sealed with: only
              // its randomness and keys are drawn now, and it is sealed once
              // the token is back (./dap.js).
              built.push(await new DapClient(task, sealTo, dap).prepareInvited(answers[i]));
              continue;
            }
            built.push(
              dap
                ? await new DapClient(task, sealTo, dap).buildDapReport(answers[i])
                : await new Client(task, sealTo).buildReport(answers[i]),
            );
          }
          const reports = built.map((r, i) =>
            r === null
              ? null
              : r instanceof Uint8Array
                ? { task_id: tasks[i].task_id, dap_report: b64e(r) }
                : 'context' in r
                  ? { task_id: tasks[i].task_id, dap_invited: r }
                  : { task_id: tasks[i].task_id, ...reportToJson(r) },
          );
          if (!(invitations && invitation)) {
            sealed = reports.filter((r) => r !== null);
            sessionStorage.setItem(storeKey, JSON.stringify(sealed));
          } else {
            say('Checking your invitation…');
            const pending = await prepareInvitation(
              tasks.map((q) => ({
                task_id: q.task_id,
                issuer_public_key: /** @type {any} */ (q).issuer_public_key,
              })),
              /** @type {any[]} */ (built),
            );
            kept = { reports, pending };
            sessionStorage.setItem(pendingKey, JSON.stringify(kept));
          }
        }
        if (kept !== null) {
          say('Checking your invitation…');
          const tokens = await finishInvitation('invitation', invitation ?? '', kept.pending);
          sealed = [];
          for (const [i, r] of kept.reports.entries()) {
            if (r === null) continue;
            if (r.dap_invited === undefined) {
              sealed.push({ ...r, token: b64e(tokens[i]) });
              continue;
            }
            // Over DAP: sealed now, with its token inside (drawn and
            // randomized before: nothing is drawn again).
            const q = /** @type {any} */ (tasks[i]);
            const invited = /** @type {import('./dap.js').InvitedReport} */ (r.dap_invited);
            const task = { task_id: q.task_id, vdaf: q.vdaf, time_precision: timePrecision };
            const sealTo = {
              leader: hpkeConfigFromJson(invited.leader),
              helper: hpkeConfigFromJson(invited.helper),
            };
            const report = await new DapClient(task, sealTo, q.dap).sealInvited(invited, tokens[i]);
            sealed.push({ task_id: q.task_id, dap_report: b64e(report) });
          }
          sessionStorage.setItem(storeKey, JSON.stringify(sealed));
          // The sealed reports carry the tokens from here on.
          sessionStorage.removeItem(pendingKey);
        }
      }
      say('Sending…');
      const response = await reach('reports', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ reports: sealed }),
      });
      if (!response.ok) {
        console.error('reports', response.status, await response.text());
        say(`Not sent: ${statusMessage(response.status)}`);
        return;
      }
      sessionStorage.removeItem(storeKey);
      form.classList.add('done');
      for (const input of form.querySelectorAll('input')) input.disabled = true;
      say('Thank you: your answers were encrypted on this device and received.');
      return;
    } catch (e) {
      console.error(e);
      const message =
        e instanceof InvitationError
          ? e.message
          : e instanceof SendError
          ? e.message
          : e instanceof MeasurementError
            ? 'An answer does not fit its question. Check your answers and try again.'
            : 'Something went wrong on this page. Reload it and answer again.';
      say(`Not sent: ${message}`);
    } finally {
      if (!form.classList.contains('done')) button.disabled = false;
    }
  });
  form.dataset.ready = 'true';
}

if (typeof document !== 'undefined') {
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', main);
  else main();
}

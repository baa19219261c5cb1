// The survey page's script (bundled by scripts/build.mjs into
// src/veil/web/static/veil-survey.js; `veil survey serve` serves it with
// Subresource Integrity). It reads the answers from the form that the server
// rendered, checks them, shards and seals each one on this device with the
// Prio3 client, and posts only the sealed reports: the server never sees an
// answer.

import { MeasurementError } from './circuits.js';
import { Client, hpkeConfigFromJson, reportToJson, usableConfig } from './client.js';

/**
 * A question of the public survey description (veil.survey.public_description),
 * with the `vdaf` of its task file added by the server.
 * @typedef {{id: string, text: string, kind: string, task_id: string,
 *   vdaf: {type: string}, dp?: {local_epsilon?: string, local_max_choices?: number},
 *   options?: string[], max_choices?: number, max?: number,
 *   length?: number, labels?: string[]}} Question
 */

/** An answer the respondent must change; the message is shown by the question. */
class AnswerError extends Error {}

/**
 * The measurement of one question from the form's controls, or AnswerError.
 * @param {HTMLFormElement} form @param {Question} q
 */
export function readAnswer(form, q) {
  const controls = /** @type {NodeListOf<HTMLInputElement>} */ (
    form.querySelectorAll(`[name="${q.id}"]`)
  );
  const checked = [...controls].filter((c) => c.checked);
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
    default:
      throw new AnswerError(`This page cannot answer a question of kind ${q.kind}.`);
  }
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
  const response = await fetch(url, { headers: { Accept: 'application/json' } });
  if (!response.ok) throw new Error(`${url}: ${response.status} ${await response.text()}`);
  return response.json();
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
  /** @type {unknown[] | null} reports already built, sent again as they are on a retry */
  let sealed = null;

  form.addEventListener('input', (event) => {
    const box = /** @type {HTMLElement} */ (event.target).closest('.question');
    if (box) showError(/** @type {HTMLElement} */ (box), '');
  });

  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const button = /** @type {HTMLButtonElement} */ (form.querySelector('button[type=submit]'));
    button.disabled = true;
    try {
      survey ??= await getJson('survey.json');
      const { questions, time_precision: timePrecision } =
        /** @type {{questions: Question[], time_precision: number}} */ (survey);
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
        say('Encrypting your answers on this device…');
        const configs = await getJson('hpke-configs.json');
        const reports = [];
        for (let i = 0; i < questions.length; i++) {
          const q = questions[i];
          const c = configs[q.task_id];
          const client = new Client(
            { task_id: q.task_id, vdaf: q.vdaf, time_precision: timePrecision, dp: q.dp },
            {
              leader: usableConfig(c.leader.map(hpkeConfigFromJson)),
              helper: usableConfig(c.helper.map(hpkeConfigFromJson)),
            },
          );
          const report = await client.buildReport(answers[i]);
          reports.push({ task_id: q.task_id, ...reportToJson(report) });
        }
        sealed = reports;
      }
      say('Sending…');
      const response = await fetch('reports', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ reports: sealed }),
      });
      const body = await response.json().catch(() => ({}));
      if (!response.ok) {
        say(`Not sent: ${body.error ?? response.status}. Try again in a moment.`);
        return;
      }
      form.classList.add('done');
      for (const input of form.querySelectorAll('input')) input.disabled = true;
      say('Thank you: your answers were encrypted on this device and received.');
      return;
    } catch (e) {
      const message = e instanceof MeasurementError ? e.message : String(e);
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

// The new-job form: the models the tenant can run (with its prices), prompt and
// output tokens, sampling parameters, labels and an image; the hold the job would
// take is quoted (quoteJob) as the input changes, before it is submitted (createJob).

import { gql } from './api.js';
import { h, notice, replace } from './dom.js';
import { credits } from './money.js';

const MODELS = `query Models {
  models { name provider contextWindow maxOutputTokens price { inputPerMillion outputPerMillion } }
}`;

const QUOTE_JOB = `query QuoteJob($input: CreateJobInput!) {
  quoteJob(input: $input) { hold model inputTokenBound maxOutputTokens }
}`;

const CREATE_JOB = `mutation CreateJob($input: CreateJobInput!) {
  createJob(input: $input) { replayed job { id status } }
}`;

/** The model a new form starts on, when the server runs it. */
const PREFERRED_MODEL = 'gpt-4o-mini';
/** The server's limit of one part (decoded), which the form checks first. */
const MAX_IMAGE_BYTES = 5 * 1024 * 1024;
const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp'];
/** Quiet time after the last change before the hold is quoted again. */
const QUOTE_DEBOUNCE_MS = 300;

/** `1536` → "1.5 KiB". */
function size(bytes) {
  if (bytes < 1024) return `${bytes} bytes`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MiB`;
}

/** A file's bytes as base64, without the `data:…;base64,` prefix. */
function readBase64(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).split(',', 2)[1] ?? '');
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

/** A number field's value, or undefined when it is empty (the server's default). */
function numberOf(input) {
  return input.value.trim() === '' ? undefined : Number(input.value);
}

/** One label row: key and value, each with its own label for screen readers. */
function labelRow(index, onChange, onRemove) {
  const key = h('input', { id: `job-label-key-${index}`, class: 'label-key', autocomplete: 'off', oninput: onChange });
  const value = h('input', { id: `job-label-value-${index}`, class: 'label-value', autocomplete: 'off', oninput: onChange });
  const row = h('div', { class: 'label-row' },
    h('label', { for: `job-label-key-${index}` }, `Label ${index + 1} key`), key,
    h('label', { for: `job-label-value-${index}` }, 'value'), value,
    h('button', { type: 'button', class: 'secondary', onclick: () => onRemove(row) }, `Remove label ${index + 1}`));
  row.read = () => ({ key: key.value.trim(), value: value.value.trim() });
  return row;
}

/** A folded form that quotes the hold while it is filled, then creates the job. */
export function newJobForm() {
  const model = h('select', { id: 'job-model', name: 'model', required: true, 'aria-describedby': 'job-model-help' },
    h('option', { value: '' }, 'Loading models…'));
  const modelHelp = h('p', { id: 'job-model-help', class: 'help' }, 'Prices are yours, per million tokens (in / out).');
  const prompt = h('textarea', { id: 'job-prompt', name: 'prompt', rows: 3, required: true });
  const maxOutputTokens = h('input', { id: 'job-max-tokens', name: 'maxOutputTokens', type: 'number', min: 1, value: 200, required: true });
  const stream = h('input', { id: 'job-stream', name: 'streamOutput', type: 'checkbox', checked: true });
  const temperature = h('input', { id: 'job-temperature', type: 'number', min: 0, max: 2, step: 0.1, placeholder: 'provider default' });
  const topP = h('input', { id: 'job-top-p', type: 'number', min: 0, max: 1, step: 0.05, placeholder: 'provider default' });
  const seed = h('input', { id: 'job-seed', type: 'number', step: 1, placeholder: 'none' });
  const stop = h('textarea', { id: 'job-stop', rows: 2, 'aria-describedby': 'job-stop-help' });
  const labels = h('div', { class: 'label-rows', 'data-testid': 'job-label-rows' });
  const image = h('input', { id: 'job-image', type: 'file', accept: IMAGE_TYPES.join(','), 'aria-describedby': 'job-image-help' });
  const imageState = h('p', { class: 'help', role: 'status', 'data-testid': 'job-image-state' });
  const hold = h('output', { id: 'job-hold', for: 'job-model job-prompt job-max-tokens', 'aria-live': 'polite', 'data-testid': 'job-hold' },
    'Choose a model and write a prompt to see the hold.');
  const message = h('div', {});
  // One idempotency key per intended job: a double submit creates one job.
  let idempotencyKey = `console-${crypto.randomUUID()}`;
  let picture = null;
  let models = [];
  let quoteTimer = null;
  // Only the newest quote may draw: an older one answering late describes old input.
  let newestQuote = 0;
  let labelCount = 0;

  function input() {
    const content = { role: 'user', content: prompt.value };
    if (picture) content.parts = [{ type: 'IMAGE', data: picture.data, mediaType: picture.mediaType }];
    const stops = stop.value.split('\n').filter((line) => line !== '');
    const chosenLabels = Array.from(labels.children).map((row) => row.read())
      .filter((label) => label.key !== '' || label.value !== '');
    return {
      idempotencyKey,
      model: model.value,
      messages: [content],
      maxOutputTokens: Number(maxOutputTokens.value),
      streamOutput: stream.checked,
      temperature: numberOf(temperature),
      topP: numberOf(topP),
      seed: numberOf(seed),
      stop: stops.length ? stops : undefined,
      labels: chosenLabels.length ? chosenLabels : undefined,
    };
  }

  async function quote() {
    const request = ++newestQuote;
    if (model.value === '' || prompt.value.trim() === '') {
      replace(hold, 'Choose a model and write a prompt to see the hold.');
      return;
    }
    replace(hold, 'Quoting the hold…');
    try {
      const { quoteJob } = await gql(QUOTE_JOB, { input: input() });
      if (request !== newestQuote) return;
      replace(hold, 'Hold before submitting: ', h('strong', { 'data-testid': 'job-hold-amount' }, credits(quoteJob.hold)),
        ` (on ${quoteJob.model}: up to ${quoteJob.inputTokenBound} input and ${quoteJob.maxOutputTokens} output tokens a call)`);
    } catch (error) {
      if (request === newestQuote) replace(hold, `No hold: ${error.message}`);
    }
  }

  function changed() {
    clearTimeout(quoteTimer);
    quoteTimer = setTimeout(quote, QUOTE_DEBOUNCE_MS);
  }

  function addLabel() {
    labels.append(labelRow(labelCount, changed, (row) => {
      row.remove();
      changed();
    }));
    labelCount += 1;
  }

  function modelChosen() {
    const chosen = models.find((candidate) => candidate.name === model.value);
    if (chosen?.maxOutputTokens) maxOutputTokens.max = chosen.maxOutputTokens;
    else maxOutputTokens.removeAttribute('max');
    changed();
  }

  model.addEventListener('change', modelChosen);
  for (const field of [prompt, maxOutputTokens, temperature, topP, seed, stop]) field.addEventListener('input', changed);
  stream.addEventListener('change', changed);
  image.addEventListener('change', async () => {
    const [file] = image.files;
    picture = null;
    if (!file) {
      replace(imageState, 'No image.');
    } else if (!IMAGE_TYPES.includes(file.type)) {
      replace(imageState, `${file.name} is not a PNG, JPEG, GIF or WebP image.`);
    } else if (file.size > MAX_IMAGE_BYTES) {
      replace(imageState, `${file.name} is ${size(file.size)}: at most ${size(MAX_IMAGE_BYTES)}.`);
    } else {
      picture = { data: await readBase64(file), mediaType: file.type, name: file.name };
      replace(imageState, `${file.name}, ${size(file.size)}, sent with the prompt.`);
    }
    changed();
  });

  // Read when the form is first opened, not with every list: a page that never
  // creates a job sends nothing for it.
  let modelsLoaded = null;
  function loadModels() {
    modelsLoaded ??= gql(MODELS).then(({ models: served }) => {
      models = served;
      replace(model, served.map((entry) => h('option', { value: entry.name },
        `${entry.name} (${entry.provider}): ${credits(entry.price.inputPerMillion)} / ${credits(entry.price.outputPerMillion)}`)));
      model.value = served.some((entry) => entry.name === PREFERRED_MODEL) ? PREFERRED_MODEL : served[0]?.name ?? '';
      modelChosen();
    }, (error) => replace(message, notice(`Could not load the models: ${error.message}`, 'error')));
    return modelsLoaded;
  }

  return h('details', { class: 'new-job', ontoggle: (event) => { if (event.target.open) loadModels(); } },
    h('summary', {}, 'New job'),
    h('form', { class: 'stack', onsubmit: async (event) => {
      event.preventDefault();
      clearTimeout(quoteTimer);
      // A submit right after opening waits for the model list it chooses from.
      await loadModels();
      try {
        const { createJob } = await gql(CREATE_JOB, { input: input() });
        idempotencyKey = `console-${crypto.randomUUID()}`;
        location.hash = `#/jobs/${createJob.job.id}`;
      } catch (error) {
        replace(message, notice(`Could not create the job: ${error.message}`, 'error'));
      }
    } },
    h('label', { for: 'job-model' }, 'Model'), model, modelHelp,
    h('label', { for: 'job-prompt' }, 'Prompt'), prompt,
    h('label', { for: 'job-max-tokens' }, 'Most output tokens'), maxOutputTokens,
    h('label', { class: 'inline' }, stream, ' Stream the output to its page'),
    h('fieldset', {}, h('legend', {}, 'Parameters (optional)'),
      h('label', { for: 'job-temperature' }, 'Temperature (0 to 2)'), temperature,
      h('label', { for: 'job-top-p' }, 'Top p (above 0, at most 1)'), topP,
      h('label', { for: 'job-seed' }, 'Seed'), seed,
      h('label', { for: 'job-stop' }, 'Stop sequences'), stop,
      h('p', { id: 'job-stop-help', class: 'help' }, 'One per line, at most 4.')),
    h('fieldset', {}, h('legend', {}, 'Labels (optional)'), labels,
      h('button', { type: 'button', class: 'secondary', onclick: addLabel }, 'Add label')),
    h('fieldset', {}, h('legend', {}, 'Image (optional)'),
      h('label', { for: 'job-image' }, 'Image file'), image,
      h('p', { id: 'job-image-help', class: 'help' }, `PNG, JPEG, GIF or WebP, at most ${size(MAX_IMAGE_BYTES)}.`),
      imageState),
    hold,
    h('button', { type: 'submit' }, 'Create job'), message));
}

#!/usr/bin/env node
// Writes Llama 3's and Llama 2's tokenizers as Hugging Face tokenizer.json files, from the
// vocabularies the npm packages `llama3-tokenizer-js` and `llama-tokenizer-js` ship, and
// (with --golden) the reference ids Tessera's tokenizer (src/data/tokenizer.h) is tested
// against:
//
//   node tools/make_hf_tokenizers.mjs --out DIR            # DIR/llama3/, DIR/llama2/
//   node tools/make_hf_tokenizers.mjs --out DIR --golden   # also the golden file below
//
// DIR/<name>/ gets tokenizer.json (laid out as Meta's files on the Hugging Face Hub are) and
// tokenizer_config.json (bos/eos). --golden writes tests/data/golden/hf_tokenizer_golden.json:
// for each text of a held-out multilingual set (prose, code, emoji, CJK, RTL), the ids of each
// package's own encoder and Llama 3's pre-tokenization pieces. Before writing, every written
// tokenizer.json is read back by @huggingface/tokenizers (a JavaScript port of Hugging Face's
// tokenizers) and must encode every text to the package's ids, so the files are the
// vocabularies as the packages encode with them.
//
// The vocabularies are Meta's (Llama 2 and Llama 3 community licences), so they are not
// committed: scripts/test.sh runs this script into the build tree when node and npm are
// present, and the tests that need them skip (saying so) otherwise. The golden ids are
// committed. Run from the repository root after `cd tools && npm ci`.
import fs from 'fs';
import path from 'path';
import { createRequire } from 'module';
import { fileURLToPath } from 'url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..');
const require = createRequire(import.meta.url);
const { Llama3Tokenizer } = await import(path.join(here, 'node_modules/llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js'));
const llama2 = (await import(path.join(here, 'node_modules/llama-tokenizer-js/llama-tokenizer.js'))).default;
const { Tokenizer } = require(path.join(here, 'node_modules/@huggingface/tokenizers/dist/tokenizers.cjs'));
const llama3 = new Llama3Tokenizer();

const args = process.argv.slice(2);
const out = args.includes('--out') ? args[args.indexOf('--out') + 1] : null;
if (!out) {
  console.error('usage: node tools/make_hf_tokenizers.mjs --out DIR [--golden]');
  process.exit(2);
}

// The merges of a package, by rank (the packages keep them as "left right" -> priority).
function mergesByRank(tok) {
  return [...tok.merges.entries()].sort((a, b) => a[1] - b[1]).map(([m]) => m);
}

const LLAMA3_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function llama3Json() {
  const vocab = {};
  const added = [];
  llama3.vocabById.forEach((t, id) => {
    if (id < 128000) vocab[t] = id;
    else added.push({ id, content: t, single_word: false, lstrip: false, rstrip: false,
                      normalized: false, special: true });
  });
  return {
    version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: LLAMA3_PATTERN }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: { type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
             { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [128000], tokens: ['<|begin_of_text|>'] } } },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
             vocab, merges: mergesByRank(llama3) },
  };
}

function llama2Json() {
  const vocab = {};
  llama2.vocabById.forEach((t, id) => { vocab[t] = id; });
  const special = (id, content) => ({ id, content, single_word: false, lstrip: false, rstrip: false,
                                      normalized: false, special: true });
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [special(0, '<unk>'), special(1, '<s>'), special(2, '</s>')],
    normalizer: { type: 'Sequence', normalizers: [
      { type: 'Prepend', prepend: '▁' },
      { type: 'Replace', pattern: { String: ' ' }, content: '▁' }] },
    pre_tokenizer: null,
    post_processor: { type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
             { SpecialToken: { id: '<s>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } } },
    decoder: { type: 'Sequence', decoders: [
      { type: 'Replace', pattern: { String: '▁' }, content: ' ' },
      { type: 'ByteFallback' }, { type: 'Fuse' },
      { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
    model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false,
             vocab, merges: mergesByRank(llama2) },
  };
}

// Held out from everything the tokenizers were written against: prose in several scripts,
// code, numbers, emoji (with ZWJ sequences and skin tones), odd whitespace.
const TEXTS = [
  'Hello, world! It\'s a test: don\'t, won\'t, they\'re, I\'ve, we\'ll, she\'d, I\'M, YOU\'LL.',
  'The year 2024 had 366 days; 1234567 is seven digits and 3.14159 is π.',
  'Der Weißstorch (Ciconia ciconia) ist eine Vogelart aus der Familie der Störche.',
  'Le cœur a ses raisons que la raison ne connaît point. « Très bien », dit-elle.',
  'Съешь же ещё этих мягких французских булок, да выпей чаю.',
  'Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.',
  '東京は日本の首都です。人口は約1400万人で、世界最大の都市圏の一つです。',
  '我们一起学习机器学习和深度学习吧！这是一个测试句子。',
  '한국어 문장도 잘 토큰화되어야 합니다. 안녕하세요!',
  'مرحبا بالعالم، هذه جملة اختبار باللغة العربية.',
  'שלום עולם! זהו משפט בדיקה בעברית.',
  'हिन्दी में भी एक वाक्य: नमस्ते दुनिया।',
  'ภาษาไทยไม่มีช่องว่างระหว่างคำ',
  'def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n',
  '#include <stdio.h>\nint main(void) {\n\tprintf("%d\\n", 42);\n\treturn 0;\n}\n',
  'for (let i = 0; i < 10; i++) { console.log(`i = ${i}`); } // loop\r\n',
  '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
  'SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;',
  'Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇯🇵 🤖✨',
  'Math: ∀x∈ℝ, x² ≥ 0; ∑_{i=1}^{n} i = n(n+1)/2 → ∞ ≈ ≠ ≤',
  'Tabs\tand  double  spaces   and\n\n\nnewlines \n trailing   ',
  '   leading spaces and a final newline\n',
  'URL: https://example.com/path?query=1&x=y#frag — email@example.org',
  'Mixed: naïve café résumé façade coöperate; ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ',
  'CamelCaseIdentifiers and snake_case_names and SCREAMING_CASE; x86_64 v1.2.3-rc4',
  "Quotes: 'single' \"double\" ‘curly’ “curly” `back`; 's 'S 'Re 'LL 'D",
  '1 12 123 1234 12345 123456 ٣٤٥ ౧౨౩ 一二三',
  'a',
  ' ',
  '\n',
];

function pieces(text) {
  // The package's own pre-tokenization regex (what llama3-tokenizer-js encodes with).
  const re = new RegExp("(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", 'gu');
  return [...text.matchAll(re)].map((m) => m[0]);
}

const made = { llama3: llama3Json(), llama2: llama2Json() };
const config = {
  llama3: { bos_token: '<|begin_of_text|>', eos_token: '<|end_of_text|>' },
  llama2: { bos_token: '<s>', eos_token: '</s>' },
};
const reference = {
  llama3: (t) => llama3.encode(t, { bos: false, eos: false }),
  llama2: (t) => llama2.encode(t, false, true),
};
let failures = 0;
for (const name of Object.keys(made)) {
  const hf = new Tokenizer(made[name], config[name]);
  for (const t of TEXTS) {
    const a = reference[name](t);
    const b = hf.encode(t, { add_special_tokens: false }).ids;
    if (JSON.stringify(a) !== JSON.stringify(b)) {
      failures++;
      console.error(`${name}: the written tokenizer.json encodes ${JSON.stringify(t)} as ${b}, the package as ${a}`);
    }
  }
  const dir = path.join(out, name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(made[name]));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(config[name], null, 2) + '\n');
  console.log(`wrote ${dir}/tokenizer.json (${Object.keys(made[name].model.vocab).length} tokens, ${made[name].model.merges.length} merges)`);
}
if (failures) {
  console.error(`${failures} texts differ between the packages and @huggingface/tokenizers`);
  process.exit(1);
}
if (args.includes('--golden')) {
  const golden = {
    generator: 'tools/make_hf_tokenizers.mjs',
    node: process.version,
    unicode: process.versions.unicode,
    texts: TEXTS.map((t) => ({ text: t, llama3: reference.llama3(t), llama2: reference.llama2(t),
                               llama3_pieces: pieces(t) })),
  };
  const file = path.join(root, 'tests/data/golden/hf_tokenizer_golden.json');
  fs.writeFileSync(file, JSON.stringify(golden, null, 1) + '\n');
  console.log(`wrote ${file}`);
}

#include "sim/validation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>

#include "io/fs.h"
#include "parallel/sharding_search.h"
#include "sim/framework_terms.h"

namespace tessera {

namespace {

const std::string kEmpty;

// Splits CSV text into records of cells (quotes, doubled quotes, newlines inside quotes).
Result<std::vector<std::vector<std::string>>> parse_csv(const std::string& text,
                                                        const std::string& path) {
  std::vector<std::vector<std::string>> rows(1);
  std::string cell;
  bool quoted = false;
  int line = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\n') ++line;
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        cell += '"', ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cell += c;
      }
    } else if (c == '"') {
      if (!cell.empty())
        return error(path + ":" + std::to_string(line) + ": a quote inside an unquoted cell");
      quoted = true;
    } else if (c == ',') {
      rows.back().push_back(std::move(cell)), cell.clear();
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') continue;
      rows.back().push_back(std::move(cell)), cell.clear();
      rows.emplace_back();
    } else {
      cell += c;
    }
  }
  if (quoted) return error(path + ": unterminated quoted cell at the end of the file");
  if (!cell.empty() || !rows.back().empty()) rows.back().push_back(std::move(cell));
  while (!rows.empty() && rows.back().empty()) rows.pop_back();
  return rows;
}

// A cell that is exactly one number ("2048", "0.3"); not ">173", "~55" or "128-512".
bool number(const std::string& s, double* out) {
  if (s.empty()) return false;
  size_t used = 0;
  try {
    *out = std::stod(s, &used);
  } catch (...) {
    return false;
  }
  return used == s.size() && std::isfinite(*out);
}

bool contains(const std::string& s, const char* what) {
  std::string a = s, b = what;
  std::transform(a.begin(), a.end(), a.begin(), ::tolower);
  std::transform(b.begin(), b.end(), b.begin(), ::tolower);
  return a.find(b) != std::string::npos;
}

// Whether the row's TFLOP/s are Megatron-LM's own model-FLOPs count (its
// `num_floating_point_operations`, as its README's tables give them with MFU: forward and
// backward once, no recomputation), which for a GPT of multi-head attention and a 4h MLP is
// megatron_model_flops (cost/flops.h). Not PaLM's 6N + 12lhs count, nor another model's
// (grouped queries and gated MLPs change Megatron's formula).
bool megatron_model_flops_basis(const PublishedRun& r, const ModelConfig& m) {
  const std::string& basis = r.at("tflops_basis");
  return contains(basis, "model FLOPs") && contains(basis, "MFU basis") && !contains(basis, "6N") &&
         contains(r.at("framework"), "Megatron") && m.family == "gpt" && m.ffn() == 4 * m.n_embd &&
         !m.is_moe();
}

Status need(const PublishedRun& r, const std::string& column, double* out) {
  const std::string& s = r.at(column);
  if (s.empty()) return error(column + " not published");
  if (!number(s, out)) return error(column + " '" + s + "' is not a single number");
  return Status();
}

Result<std::string> cluster_for(const std::string& gpu) {
  if (contains(gpu, "H100")) return std::string("dgx-h100");
  if (contains(gpu, "A100") && contains(gpu, "40")) return std::string("dgx-a100-40gb");
  if (contains(gpu, "A100")) return std::string("dgx-a100");
  if (contains(gpu, "V100")) return std::string("v100-dgx2");
  if (contains(gpu, "MI250X")) return std::string("frontier");
  return error("no cluster preset for GPU '" + gpu + "'");
}

}  // namespace

bool node_network_gbits(const std::string& s, double* gbits) {
  std::smatch m;
  // Intel Omni-Path (100 series): 100 Gb/s per link.
  static const std::regex opa(R"(Omni-Path\D*(\d+) links? per node)");
  if (std::regex_search(s, m, opa)) {
    *gbits = 100.0 * std::stod(m[1].str());
    return true;
  }
  auto rate = [](const std::smatch& x, size_t i) {
    return std::stod(x[i].str()) * (x[i + 1].str()[0] == 'T' ? 1000.0 : 1.0);
  };
  // A count of links: "8x 400 Gb/s InfiniBand NDR", "8x HDR InfiniBand 200Gb/s HCAs".
  static const std::regex links(R"((\d+)\s*x\s*\D*?(\d+(?:\.\d+)?)\s*(Gbps|Gb/s|Tbps|Tb/s))");
  if (std::regex_search(s, m, links)) {
    *gbits = std::stod(m[1].str()) * rate(m, 2);
    return true;
  }
  static const std::regex re(R"((\d+(?:\.\d+)?)\s*(Gbps|Gb/s|Tbps|Tb/s))");
  if (!std::regex_search(s, m, re)) return false;
  *gbits = rate(m, 1);
  return true;
}

int device_nvlinks(const std::string& s) {
  std::smatch m;
  // "NVLink 4 inter-gpu connects" (BigScience's rows), "4 NVLink GPU-to-GPU interconnects"
  // (the BLOOM paper), "12 NVLink links". Not a generation ("NVLink4/NVSwitch"): the count is
  // a word of its own.
  static const std::regex after(
      R"(NVLinks?\s+(\d{1,3})\s+(?:inter-?gpu\s+|gpu-to-gpu\s+)?(?:inter)?(?:connects|connections|links))",
      std::regex::icase);
  static const std::regex before(
      R"((?:^|\s|\()(\d{1,3})\s*x?\s*NVLinks?\s+(?:inter-?gpu\s+|gpu-to-gpu\s+)?(?:inter)?(?:connects|connections|links))",
      std::regex::icase);
  if (std::regex_search(s, m, after) || std::regex_search(s, m, before))
    return std::stoi(m[1].str());
  return 0;
}

namespace {

// A GPT decoder's depth from its published size: the blocks (attention 4h^2 + 4h, MLP
// 2hF + F + h with F the published ffn_hidden or 4h, two norms 4h) that, with the embedding
// tables (vocab x h, seq x h), come nearest the published parameters (a size rounded to a few
// digits leaves a fraction of a block either way).
Result<double> layers_from_params(const PublishedRun& r, double hidden, double vocab, double seq,
                                  RunSetup* s) {
  double billions;
  if (!number(r.at("params_B"), &billions) || billions <= 0)
    return error("layers not published (nor params_B, to derive them)");
  const double h = hidden, total = billions * 1e9;
  double ffn = 4 * h;
  number(r.at("ffn_hidden"), &ffn);
  const double block = 4 * h * h + 4 * h + 2 * h * ffn + ffn + h + 4 * h;
  const double rest = total - vocab * h - seq * h - 2 * h;
  const double layers = std::round(rest / block);
  if (layers < 1)
    return error("layers not published, and " + r.at("params_B") + "B parameters at hidden " +
                 r.at("hidden") + " do not make one block");
  s->assumptions.push_back("layers = " + std::to_string(static_cast<int64_t>(layers)) +
                           " (not published; the depth of a " + r.at("params_B") +
                           "B-parameter decoder at hidden " + r.at("hidden") + ")");
  return layers;
}

// Heads where a row does not give them: 128-wide (the common size), or the count nearest it
// that divides the hidden size and splits over the tensor-parallel ranks (borrow_sibling_heads
// runs first). The attention's FLOPs do not depend on it; its speed can, where an unfused
// attention's heads are off the 8-element alignment (DeviceSpec::unaligned_attention_efficiency).
Result<double> heads_for(double hidden, double tp, RunSetup* s) {
  const int64_t h = static_cast<int64_t>(hidden), ranks = static_cast<int64_t>(tp);
  const double want = hidden / 128;
  int64_t best = 0;
  for (int64_t n = ranks; n <= h; n += ranks)
    if (h % n == 0 && (best == 0 || std::fabs(n - want) < std::fabs(best - want))) best = n;
  if (best == 0) return error("heads not published, and no head count splits over tp");
  s->assumptions.push_back("heads = " + std::to_string(best) + " of " + std::to_string(h / best) +
                           " (not published)");
  return static_cast<double>(best);
}

// The preset of a public model a row names without its dimensions (MT-NLG 530B, GPT-3 175B,
// the 1T model, Megatron's 8.3B), or "" when the name is not one of them.
std::string public_model(const std::string& name) {
  const bool gpt = contains(name, "gpt");
  if ((contains(name, "mt-nlg") || contains(name, "megatron-turing")) ||
      (gpt && contains(name, "530b")))
    return "mt-nlg-530b";
  if (gpt && (contains(name, "175b") || name == "GPT-3")) return "gpt3-175b";
  if (gpt && contains(name, "1t")) return "gpt-1t";
  if (gpt && contains(name, "8.3b")) return "megatron-8.3b";
  return "";
}

// The vocabulary of a decoder row that does not give it, from the model's family: GPT-2's
// BPE (50,257) for the GPT-3-style models of Megatron, DeepSpeed and NeMo, and Nemotron's
// 256,000-token SentencePiece.
Result<double> vocab_for(const PublishedRun& r, RunSetup* s) {
  const std::string& name = r.at("model_name");
  if (contains(name, "nemotron")) {
    s->assumptions.push_back("vocab 256000 (not published; Nemotron's SentencePiece)");
    return 256000.0;
  }
  if (contains(name, "gpt") || contains(name, "nlg")) {
    s->assumptions.push_back("vocab 50257 (not published; GPT-2's BPE, as GPT-3-style runs use)");
    return 50257.0;
  }
  return error("vocab not published");
}

Result<ModelConfig> model_for(const PublishedRun& r, double tp, RunSetup* s) {
  const std::string& name = r.at("model_name");
  if (contains(r.at("architecture"), "T5")) {
    // T5 rows name the released size; its dimensions are the preset's.
    for (const char* size : {"small", "base", "large", "3b", "11b"})
      if (contains(name, (std::string("t5-") + size).c_str())) {
        const std::string preset = std::string("t5-") + size;
        s->assumptions.push_back("dimensions of preset " + preset);
        return *find_preset(preset);
      }
    return error("T5 model '" + name + "' without a matching preset");
  }
  if (contains(r.at("architecture"), "llama")) {
    // A named Llama 2 / Llama 3 size takes its preset's dimensions where the row leaves
    // them out; a row that gives its width, depth and heads is read as it is (the MLP width
    // LLaMA's rule makes when not published: 8/3 x width up to a multiple of 256).
    std::string preset;
    static const std::regex family(R"(llama[-_ ]?([23]))", std::regex::icase);
    std::smatch named;
    if (std::regex_search(name, named, family))
      for (const char* size : {"405b", "70b", "13b", "8b", "7b"}) {
        const std::string candidate = "llama" + named[1].str() + "-" + size;
        if (preset.empty() && contains(name, size) && find_preset(candidate)) preset = candidate;
      }
    double layers, hidden, heads, seq, vocab;
    if (r.at("hidden").empty() || r.at("layers").empty() || r.at("heads").empty()) {
      if (preset.empty())
        return error("LLaMA-style model '" + name + "' without a matching preset (hidden, " +
                     "layers or heads not published)");
      s->assumptions.push_back("dimensions of preset " + preset);
      ModelConfig c = *find_preset(preset);
      if (number(r.at("seq_len"), &seq))
        c.max_seq_len = std::max(c.max_seq_len, static_cast<int64_t>(seq));
      return c;
    }
    TS_RETURN_IF_ERROR(need(r, "hidden", &hidden));
    TS_RETURN_IF_ERROR(need(r, "layers", &layers));
    TS_RETURN_IF_ERROR(need(r, "heads", &heads));
    TS_RETURN_IF_ERROR(need(r, "seq_len", &seq));
    const std::optional<ModelConfig> known = preset.empty() ? std::nullopt : find_preset(preset);
    ModelConfig c = known ? *known : ModelConfig{};
    c.name = name;
    c.family = "llama";
    c.tied_embeddings = false;
    c.n_layer = static_cast<int64_t>(layers);
    c.n_embd = static_cast<int64_t>(hidden);
    c.n_head = static_cast<int64_t>(heads);
    double kv = heads, ffn;
    if (number(r.at("kv_heads"), &kv)) {
      c.n_kv_head = static_cast<int64_t>(kv);
    } else if (!known || known->n_embd != c.n_embd) {
      c.n_kv_head = c.n_head;
      s->assumptions.push_back("as many key/value heads as heads (kv_heads not published)");
    }
    if (number(r.at("ffn_hidden"), &ffn)) {
      c.ffn_hidden = static_cast<int64_t>(ffn);
    } else if (!known || known->n_embd != c.n_embd) {
      c.ffn_hidden = (8 * c.n_embd / 3 + 255) / 256 * 256;
      s->assumptions.push_back("MLP width " + std::to_string(c.ffn_hidden) +
                               " (LLaMA's 8/3 x width rule; not published)");
    }
    if (number(r.at("vocab"), &vocab)) {
      c.vocab_size = static_cast<int64_t>(vocab);
    } else if (!known) {
      c.vocab_size = 32000;
      s->assumptions.push_back("vocabulary 32,000 (LLaMA 1/2's; not published)");
    }
    c.max_seq_len = std::max(c.max_seq_len, static_cast<int64_t>(seq));
    if (c.rope_theta <= 0) c.rope_theta = 10000.0;
    TS_RETURN_IF_ERROR(validate(c));
    return c;
  }
  double layers, hidden, heads, seq, vocab;
  TS_RETURN_IF_ERROR(need(r, "seq_len", &seq));
  if (r.at("vocab").empty()) {
    TS_ASSIGN_OR_RETURN(vocab, vocab_for(r, s));
  } else {
    TS_RETURN_IF_ERROR(need(r, "vocab", &vocab));
  }
  const std::string known = public_model(name);
  if (r.at("hidden").empty() && !known.empty()) {
    // A public model named without its dimensions: the preset's.
    ModelConfig c = *find_preset(known);
    c.name = name;
    c.vocab_size = static_cast<int64_t>(vocab);
    c.max_seq_len = std::max(c.max_seq_len, static_cast<int64_t>(seq));
    s->assumptions.push_back("dimensions of preset " + known + " (not published)");
    TS_RETURN_IF_ERROR(validate(c));
    return c;
  }
  TS_RETURN_IF_ERROR(need(r, "hidden", &hidden));
  if (r.at("layers").empty()) {
    TS_ASSIGN_OR_RETURN(layers, layers_from_params(r, hidden, vocab, seq, s));
  } else {
    TS_RETURN_IF_ERROR(need(r, "layers", &layers));
  }
  if (r.at("heads").empty() && contains(r.at("architecture"), "GPT-2")) {
    heads = hidden / 64;  // every GPT-2 size has 64-wide heads
    s->assumptions.push_back("heads = hidden / 64 (GPT-2 head size)");
  } else if (r.at("heads").empty()) {
    TS_ASSIGN_OR_RETURN(heads, heads_for(hidden, tp, s));
  } else {
    TS_RETURN_IF_ERROR(need(r, "heads", &heads));
    if (const std::string& from = r.at(kHeadsFrom); !from.empty())
      s->assumptions.push_back("heads = " + r.at("heads") + " of " +
                               std::to_string(static_cast<int64_t>(hidden / heads)) +
                               " (not published; row " + from +
                               " of the same source and width gives them)");
  }
  ModelConfig c;
  c.name = name;
  c.family = "gpt";
  c.n_layer = static_cast<int64_t>(layers);
  c.n_embd = static_cast<int64_t>(hidden);
  c.n_head = static_cast<int64_t>(heads);
  c.vocab_size = static_cast<int64_t>(vocab);
  c.max_seq_len = static_cast<int64_t>(seq);
  double ffn;
  if (number(r.at("ffn_hidden"), &ffn)) c.ffn_hidden = static_cast<int64_t>(ffn);
  TS_RETURN_IF_ERROR(validate(c));
  return c;
}

}  // namespace

const std::string& PublishedRun::at(const std::string& column) const {
  auto it = fields.find(column);
  return it == fields.end() ? kEmpty : it->second;
}

Result<std::vector<PublishedRun>> read_published_runs(const std::string& path) {
  TS_ASSIGN_OR_RETURN(std::string text, read_file(path));
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);  // spreadsheets' byte-order mark
  TS_ASSIGN_OR_RETURN(auto rows, parse_csv(text, path));
  if (rows.empty()) return error(path + ": empty file (expected a header row)");
  if (rows.size() == 1) return error(path + ": a header and no rows of published runs");
  const std::vector<std::string>& header = rows[0];
  for (const char* col : {"row_id", "source_key", "model_name", "gpu_type", "num_gpus"})
    if (std::find(header.begin(), header.end(), col) == header.end())
      return error(path + ": no column '" + col + "' in the header");
  std::vector<PublishedRun> out;
  for (size_t i = 1; i < rows.size(); ++i) {
    if (rows[i].size() != header.size())
      return error(path + ": record " + std::to_string(i) + " has " +
                   std::to_string(rows[i].size()) + " cells, the header " +
                   std::to_string(header.size()));
    PublishedRun r;
    for (size_t c = 0; c < header.size(); ++c) r.fields[header[c]] = rows[i][c];
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<PublishedRun> borrow_sibling_heads(std::vector<PublishedRun> runs) {
  const std::vector<PublishedRun> table = runs;
  // "GPT decoder (BLOOM candidate)" is a "GPT decoder": the words before a parenthesis.
  auto family = [](const std::string& a) {
    std::string f = a.substr(0, a.find('('));
    while (!f.empty() && f.back() == ' ') f.pop_back();
    return f;
  };
  for (PublishedRun& r : runs) {
    double hidden, billions;
    if (!r.at("heads").empty() || !number(r.at("hidden"), &hidden) ||
        !number(r.at("params_B"), &billions))
      continue;
    double nearest = -1;
    std::string heads, from;
    bool agree = true;
    for (const PublishedRun& o : table) {
      double oh, ob, n;
      if (o.at("source_key") != r.at("source_key") ||
          family(o.at("architecture")) != family(r.at("architecture")) ||
          !number(o.at("hidden"), &oh) || oh != hidden || !number(o.at("params_B"), &ob) ||
          !number(o.at("heads"), &n))
        continue;
      const double d = std::fabs(ob - billions);
      if (nearest < 0 || d < nearest) {
        nearest = d, heads = o.at("heads"), from = o.at("row_id"), agree = true;
      } else if (d == nearest && o.at("heads") != heads) {
        agree = false;
      }
    }
    // Only heads this row's width and tensor ranks can take (else setup_run's guess).
    double n, tp = 1;
    const bool fits = number(heads, &n) && n >= 1 && std::fmod(hidden, n) == 0 &&
                      (!number(r.at("tp"), &tp) || tp < 1 || std::fmod(n, tp) == 0);
    if (nearest >= 0 && agree && fits) r.fields["heads"] = heads, r.fields[kHeadsFrom] = from;
  }
  return runs;
}

Result<RunSetup> setup_run(const PublishedRun& r, const std::string& cluster_dir) {
  RunSetup s;
  // Parallelism: data axes and a tensor axis are in the Program today.
  double tp = 1, pp = 1, gpus, micro;
  const std::string &tps = r.at("tp"), &pps = r.at("pp");
  if (!tps.empty() && (!number(tps, &tp) || tp < 1 || tp != std::floor(tp)))
    return error("tp='" + tps + "' is not a positive integer");
  if (!pps.empty() && (!number(pps, &pp) || pp < 1 || pp != std::floor(pp)))
    return error("pp='" + pps + "' is not a positive integer");
  double vp = 1;
  const std::string& vps = r.at("vp_interleave");
  if (!vps.empty() && (!number(vps, &vp) || vp < 1 || vp != std::floor(vp)))
    return error("vp_interleave='" + vps + "' is not a positive integer");
  const std::string& sp = r.at("sequence_parallel");
  // Megatron's --tp-comm-overlap overlaps the tensor-parallel collectives with their GEMMs,
  // and takes sequence parallelism (it is refused without).
  const std::string opts = normalized_term(r.at("other_opts"));
  const bool tp_comm_overlap = tp > 1 && contains(opts, "tp_comm_overlap");
  const bool sequence_parallel =
      tp > 1 && ((!sp.empty() && !contains(sp, "no")) || (sp.empty() && tp_comm_overlap));
  // Context and expert parallelism: axes of the Program (inside the data axes).
  double cp = 1, ep = 1;
  for (auto [col, v] : {std::pair{"cp", &cp}, std::pair{"ep", &ep}}) {
    const std::string& text = r.at(col);
    if (!text.empty() && (!number(text, v) || *v < 1 || *v != std::floor(*v)))
      return error(std::string(col) + "='" + text + "' is not a positive integer");
  }
  // "8-512" GPUs with a scaling efficiency: the per-GPU throughput at the largest count over
  // that at the smallest, in percent.
  static const std::regex range(R"((\d+)\s*-\s*(\d+))");
  std::smatch m;
  double efficiency;
  if (std::regex_match(r.at("num_gpus"), m, range) &&
      number(r.at("scaling_efficiency_pct"), &efficiency)) {
    s.scale_from_gpus = std::stoi(m[1].str());
    gpus = std::stod(m[2].str());
    if (s.scale_from_gpus < 1 || s.scale_from_gpus >= gpus)
      return error("num_gpus '" + r.at("num_gpus") + "' is not an increasing range");
    s.metric = "scaling eff. %", s.published = efficiency;
  } else {
    TS_RETURN_IF_ERROR(need(r, "num_gpus", &gpus));
  }
  if (gpus < 1 || gpus != std::floor(gpus))
    return error("num_gpus='" + r.at("num_gpus") + "' is not a positive integer");
  // The expert axis is one of the data axes (its ranks hold other experts, the same tokens'
  // share): dp counts it; the context axis is not.
  double dp = gpus / (tp * pp * cp);
  const std::string cps = cp > 1 ? " x cp=" + r.at("cp") : "";
  if (dp < 1 || dp != std::floor(dp))
    return error("tp=" + tps + " x pp=" + (pps.empty() ? "1" : pps) + cps +
                 " does not divide num_gpus=" + r.at("num_gpus"));
  if (!r.at("dp").empty() && (!number(r.at("dp"), &dp) || dp * tp * pp * cp != gpus))
    return error("dp=" + r.at("dp") + " x tp=" + (tps.empty() ? "1" : tps) +
                 " x pp=" + (pps.empty() ? "1" : pps) + cps + " on " + r.at("num_gpus") +
                 " GPUs implies model parallelism of unknown kind");
  if (tps.empty() || pps.empty()) s.assumptions.push_back("tp=pp=1 (not published; dp = num_gpus)");
  // "8 and 16": runs at several micro-batches, the first modelled.
  static const std::regex several(R"((\d+) and \d+)");
  if (std::regex_match(r.at("micro_batch"), m, several)) {
    micro = std::stod(m[1].str());
    s.assumptions.push_back("micro-batch " + m[1].str() + " of '" + r.at("micro_batch") + "'");
  } else if (r.at("micro_batch").empty()) {
    micro = 1;  // chosen by fill_unpublished
    s.unpublished.push_back("micro_batch");
  } else {
    TS_RETURN_IF_ERROR(need(r, "micro_batch", &micro));
  }

  // Precision, recomputation and sharding in any framework's words (framework_terms.h); an
  // empty one is not published.
  const std::string& prec = r.at("precision");
  if (prec.empty()) {
    s.sim.precision = DType::bf16;
    s.assumptions.push_back("bf16 mixed precision (not published)");
  } else {
    TS_ASSIGN_OR_RETURN(PrecisionTerm p, parse_precision_term(prec));
    s.sim.precision = p.dtype;
    s.sim.fp8 = p.fp8;
    if (p.fp8)
      s.assumptions.push_back("FP8 GEMMs in the blocks (Transformer Engine), bf16 elsewhere");
  }
  // Pipelines: how the framework's stages hand each other their activations and gradients.
  if (pp > 1 && framework_blocks_pipeline_sends(r.at("framework"))) {
    s.sim.blocking_p2p = true;
    s.assumptions.push_back("each send between stages blocks its stage (" + r.at("framework") +
                            ")");
  }
  // Attention as the framework ran it in the row's year: before FlashAttention, kernels around
  // a score matrix in memory.
  double published_year = 0;
  const int year =
      number(r.at("source_year"), &published_year) ? static_cast<int>(published_year) : 0;
  if (framework_materializes_attention(r.at("framework"), year)) {
    s.sim.attention = AttentionKernel::materialized;
    s.assumptions.push_back("attention's score matrix in memory (" + r.at("framework") + ", " +
                            r.at("source_year") + ": before FlashAttention)");
  }
  if (framework_fuses_grad_accumulation(r.at("framework"), year)) {
    s.sim.fused_grad_accumulation = true;
    s.assumptions.push_back("the weight-gradient GEMMs add into the micro-batches' sums (" +
                            r.at("framework") + "'s gradient-accumulation fusion)");
  }
  if (tp_comm_overlap) {
    s.sim.tp_comm_overlap = true;
    s.assumptions.push_back(
        "tensor-parallel collectives overlapped with their GEMMs, with sequence parallelism "
        "(--tp-comm-overlap)");
  }
  if (contains(opts, "overlap_param_gather")) {
    s.sim.overlap_param_gather = true;
    s.assumptions.push_back(
        "each parameter all-gather of ZeRO-1/2 beside the next step's forward "
        "(--overlap-param-gather)");
  }
  if (s.sim.precision == DType::f16 && framework_sums_f16_gradients_in_f16(r.at("framework"))) {
    s.sim.f16_gradient_sums = true;
    s.assumptions.push_back("each gradient summed over the micro-batches in fp16 (" +
                            r.at("framework") + ")");
  }
  const std::string& rc = r.at("activation_recompute");
  std::optional<RecomputeTerm> recompute;
  if (!rc.empty()) {
    TS_ASSIGN_OR_RETURN(RecomputeTerm t, parse_recompute_term(rc));
    recompute = t;
  }
  const std::string& z = r.at("zero_or_fsdp");
  std::optional<ShardingTerm> sharding;
  if (!z.empty()) {
    TS_ASSIGN_OR_RETURN(ShardingTerm t, parse_sharding_term(z));
    sharding = t;
  }

  s.plan = tp > 1 ? Plan::tensor_parallel(static_cast<int>(dp), static_cast<int>(tp), 0)
                  : Plan::data_parallel(static_cast<int>(dp), 0);
  if (pp > 1) {
    s.plan = Plan::pipeline_parallel(static_cast<int>(pp), static_cast<int>(dp),
                                     static_cast<int>(tp), 0);
    if (vp > 1) {
      s.plan.schedule = ScheduleKind::interleaved;
      s.plan.virtual_stages = static_cast<int>(vp);
    }
    s.assumptions.push_back(std::string("pipeline schedule ") + schedule_name(s.plan.schedule));
  }
  if (sharding && sharding->hsdp) {
    if (pp > 1 || cp > 1 || ep > 1)
      return error("sharding '" + z +
                   "' (HSDP) with pipeline, context or expert parallelism is "
                   "not modeled");
    // Without a published degree, a shard group is a node's data-parallel ranks (PyTorch's).
    double per_node = 8;
    number(r.at("gpus_per_node"), &per_node);
    const int shard =
        sharding->shard > 0 ? sharding->shard : std::max(1, static_cast<int>(per_node / tp));
    if (static_cast<int64_t>(dp) % shard != 0)
      return error("sharding '" + z + "': a shard group of " + std::to_string(shard) +
                   " does not divide the " + std::to_string(static_cast<int64_t>(dp)) +
                   " data-parallel ranks");
    s.plan = Plan::hybrid_sharded(static_cast<int>(dp) / shard, shard, static_cast<int>(tp));
    if (sharding->zero == 2) s.plan.zero = 2;
    if (sharding->shard == 0)
      s.assumptions.push_back("HSDP shard groups of " + std::to_string(shard) +
                              " ranks (a node's; not published)");
  }
  s.plan.sequence_parallel = sequence_parallel;
  if (ep > 1) {
    if (static_cast<int64_t>(dp) % static_cast<int64_t>(ep) != 0)
      return error("ep=" + r.at("ep") + " does not divide the " +
                   std::to_string(static_cast<int64_t>(dp)) + " data-parallel ranks");
    // The expert axis splits the data axis: dp / ep replicas of ep expert ranks.
    s.plan = tp > 1 ? Plan::tensor_parallel(static_cast<int>(dp / ep), static_cast<int>(tp), 0)
                    : Plan::data_parallel(static_cast<int>(dp / ep), 0);
    s.plan.sequence_parallel = sequence_parallel;
    TS_RETURN_IF_ERROR(add_expert_axis(&s.plan, static_cast<int>(ep)));
  }
  if (cp > 1) {
    // Megatron-Core's and NeMo's context parallelism balances the causal work as the zigzag
    // order does (chunks i and 2cp-1-i); a learned position table (GPT) takes contiguous.
    TS_RETURN_IF_ERROR(add_context_axis(&s.plan, static_cast<int>(cp)));
    s.assumptions.push_back("context parallelism: keys and values all-gathered over cp");
  }
  if (recompute) {
    s.plan.recompute = recompute->policy;
    // Korthikanti et al.'s selective recompute re-runs the attention core; Tessera's fused
    // attention stores no score matrix, and its selective policy re-runs the cheap ops.
    if (recompute->policy == RecomputePolicy::selective)
      s.assumptions.push_back(
          "selective recompute as Tessera's (cheap ops re-run; fused attention)");
  } else if (sharding) {
    s.assumptions.push_back("no activation recomputation (not published)");
  }
  if (!sharding && !recompute) {  // both chosen by fill_unpublished
    s.unpublished.push_back("zero");
    s.unpublished.push_back("recompute");
  } else if (sharding && !sharding->hsdp) {
    s.plan.zero = sharding->zero;
  } else if (!sharding) {
    s.assumptions.push_back("plain data parallelism (no ZeRO stage published)");
  }

  // A row whose plan is partly filled and that does not say whether its tensor ranks split the
  // sequence: the planner's choice too.
  // (Not before 2022: Megatron's sequence parallelism is Korthikanti et al. 2022.)
  if (!s.unpublished.empty() && tp > 1 && sp.empty() && !tp_comm_overlap) {
    if (year > 0 && year < 2022)
      s.assumptions.push_back("no sequence parallelism (not published; it dates from 2022)");
    else
      s.unpublished.push_back("sequence_parallel");
  }
  // ... and, with stages in a framework that interleaves them, how many chunks each holds.
  s.framework = r.at("framework");
  if (!s.unpublished.empty() && pp > 1 && vps.empty() &&
      framework_interleaves_pipelines(s.framework))
    s.unpublished.push_back("virtual_stages");
  TS_ASSIGN_OR_RETURN(s.model, model_for(r, tp, &s));
  if (pp > 1) {  // the stages as the framework cuts them, else balanced by cost
    if (task_of(s.model) == ModelTask::language_model)
      s.plan.stage_layers = framework_pipeline_cut(
          r.at("framework"), static_cast<int>(s.model.n_layer), s.plan.chunks());
    std::string cut;
    for (int b : s.plan.stage_layers) cut += (cut.empty() ? "" : ",") + std::to_string(b);
    s.assumptions.push_back(
        cut.empty() ? std::string("stages balanced by the cost model")
                    : "blocks per pipeline chunk " + cut + " as " + r.at("framework") +
                          " cuts them (the embedding on the first, the " + "head on the last)");
  }
  if (cp > 1 && s.model.family == "llama") s.plan.context_order = ContextOrder::zigzag;
  // The rows list the tokenizer's vocabulary; the frameworks train a padded table (Megatron-LM
  // and Megatron-DeepSpeed to a multiple of 128 x tp, llm.c GPT-2's 50,257 to 50,304). Where a
  // tensor rank's rows would not be a multiple of 8 (GEMMs off the tensor cores' alignment:
  // DeviceSpec::unaligned_gemm_efficiency), pad as Megatron-LM does; aligned sizes stay as
  // published (llm-foundry's 50,368, LLaMA's 32,000).
  const int64_t tp_ranks = static_cast<int64_t>(tp), rows = s.model.vocab_rows();
  if (rows % tp_ranks != 0 || (rows / tp_ranks) % 8 != 0) {
    const int64_t multiple = 128 * tp_ranks;
    s.model.padded_vocab_size = (rows + multiple - 1) / multiple * multiple;
    s.assumptions.push_back("vocabulary padded to " + std::to_string(s.model.padded_vocab_size) +
                            " rows (a multiple of 128 x tp, as Megatron-LM and llm.c pad it)");
  }
  double seq;
  TS_RETURN_IF_ERROR(need(r, "seq_len", &seq));
  s.seq = static_cast<int64_t>(seq);
  s.model.max_seq_len = std::max(s.model.max_seq_len, s.seq);
  if (task_of(s.model) == ModelTask::span_corruption) {
    const SpanCorruption sc = span_corruption(s.seq);
    s.assumptions.push_back("seq_len " + std::to_string(s.seq) +
                            " as text per example: " + std::to_string(sc.encoder_len()) +
                            " encoder, " + std::to_string(sc.decoder_len()) + " decoder tokens");
  }
  s.batch = static_cast<int64_t>(micro * dp);
  double global, global_tokens;
  bool have_global = number(r.at("global_batch_seqs"), &global);
  if (!have_global && number(r.at("global_batch_tokens"), &global_tokens)) {
    global = global_tokens / seq;
    have_global = true;
  }
  if (have_global) {
    double accum = global / (micro * dp);
    if (accum < 1 || accum != std::floor(accum))
      return error("global batch " + r.at("global_batch_seqs") + " is not a multiple of " +
                   "micro_batch x dp = " + std::to_string(static_cast<int64_t>(micro * dp)));
    s.plan.micro_batches = static_cast<int>(accum);
  } else if (!s.unpublished.empty() && s.unpublished.front() == "micro_batch") {
    return error("micro_batch not published (nor the global batch, to choose it from)");
  } else {
    s.assumptions.push_back("1 micro-batch per step (global batch not published)");
  }
  if (!framework_fuses_epilogues(r.at("framework"))) {
    s.plan.fuse = false;
    s.assumptions.push_back("each bias and GELU a kernel of its own (" + r.at("framework") + ")");
  }
  TS_RETURN_IF_ERROR(validate(s.plan));

  TS_ASSIGN_OR_RETURN(std::string preset, cluster_for(r.at("gpu_type")));
  TS_ASSIGN_OR_RETURN(
      s.cluster, load_cluster(cluster_dir.empty() ? preset : cluster_dir + "/" + preset + ".toml"));
  double per_node, gbits;
  if (number(r.at("gpus_per_node"), &per_node)) s.cluster.node.devices = static_cast<int>(per_node);
  // NVLink 2, 3 and 4 (V100, A100, H100) each carry 25 GB/s per link and direction.
  if (int links = device_nvlinks(r.at("intra_node_link")); links > 0) {
    s.cluster.node.intra_bandwidth = links * 25e9;
    s.assumptions.push_back("NVLink " + std::to_string(links) + " links per GPU x 25 GB/s = " +
                            std::to_string(links * 25) + " GB/s one way (from the row)");
  }
  if (node_network_gbits(r.at("inter_node_network"), &gbits) && s.cluster.network.nics > 0) {
    s.cluster.network.nic_bandwidth = gbits * 1e9 / 8 / s.cluster.network.nics;
    s.assumptions.push_back("network " + std::to_string(static_cast<int>(gbits)) +
                            " Gb/s per node (from the row)");
  }
  TS_RETURN_IF_ERROR(check_precision(s.cluster, s.sim));  // FP8 on a device with an FP8 peak

  double v;
  if (s.scale_from_gpus > 0) {
    // set above
  } else if (number(r.at("tokens_per_s_per_gpu"), &v)) {
    s.metric = "tokens/s/GPU", s.published = v;
  } else if (number(r.at("iteration_time_s"), &v) && !contains(r.at("notes"), "per *layer*")) {
    s.metric = "s/iteration", s.published = v;
  } else if (number(r.at("tflops_per_gpu"), &v) && contains(r.at("tflops_basis"), "eq.(3)")) {
    s.metric = "TFLOP/s/GPU (eq.3)", s.published = v;
  } else if (number(r.at("tflops_per_gpu"), &v) && megatron_model_flops_basis(r, s.model)) {
    s.metric = "TFLOP/s/GPU (model)", s.published = v;
  } else {
    return error(
        "no comparable metric (tokens/s per GPU, s/iteration, eq.(3) TFLOP/s, or Megatron's "
        "model TFLOP/s of a GPT)");
  }
  return s;
}

}  // namespace tessera

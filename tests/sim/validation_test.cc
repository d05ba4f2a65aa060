// tessera validate: the CSV reader, how a published row becomes (or fails to become) a
// simulation, and the simulator's error on the shipped table of published runs.
#include "sim/validation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cost/flops.h"
#include "parallel/pipeline_schedule.h"

namespace tessera {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(PublishedRuns, ReadsQuotedCellsAndNamesBadRecords) {
  std::string path = write_temp("tessera_runs_ok.csv",
                                "row_id,source_key,model_name,gpu_type,num_gpus,notes\n"
                                "1,a,\"GPT, big\",A100,8,\"say \"\"hi\"\"\nsecond line\"\n"
                                "2,b,small,H100,16,\n");
  Result<std::vector<PublishedRun>> r = read_published_runs(path);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].at("model_name"), "GPT, big");
  EXPECT_EQ((*r)[0].at("notes"), "say \"hi\"\nsecond line");
  EXPECT_EQ((*r)[1].at("num_gpus"), "16");
  EXPECT_EQ((*r)[1].at("no_such_column"), "");

  path = write_temp("tessera_runs_bad.csv",
                    "row_id,source_key,model_name,gpu_type,num_gpus\n1,a,b,c\n");
  r = read_published_runs(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("record 1 has 4 cells, the header 5"), std::string::npos)
      << r.status().message();
  path = write_temp("tessera_runs_nocol.csv", "row_id,source_key\n1,a\n");
  r = read_published_runs(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no column 'model_name'"), std::string::npos);
}

// Whether one of the row's listed assumptions contains `text`.
bool says(const RunSetup& s, const std::string& text) {
  for (const std::string& a : s.assumptions)
    if (a.find(text) != std::string::npos) return true;
  return false;
}

PublishedRun mosaic_like() {
  PublishedRun r;
  r.fields = {{"row_id", "1"},
              {"source_key", "test"},
              {"model_name", "MPT-7b"},
              {"architecture", "MPT decoder"},
              {"layers", "32"},
              {"hidden", "4096"},
              {"heads", "32"},
              {"seq_len", "2048"},
              {"vocab", "50368"},
              {"global_batch_seqs", "512"},
              {"micro_batch", "8"},
              {"gpu_type", "A100 80GB"},
              {"num_gpus", "32"},
              {"precision", "amp_bf16"},
              {"tp", "1"},
              {"pp", "1"},
              {"zero_or_fsdp", "FSDP FULL_SHARD"},
              {"activation_recompute", "full"},
              {"tokens_per_s_per_gpu", "3000"}};
  return r;
}

TEST(SetupRun, BuildsModelPlanAndClusterFromARow) {
  Result<RunSetup> s = setup_run(mosaic_like());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->model.n_layer, 32);
  EXPECT_EQ(s->plan.mesh.size(), 32);
  EXPECT_EQ(s->plan.zero, 3);
  EXPECT_EQ(s->plan.recompute, RecomputePolicy::full);
  EXPECT_EQ(s->plan.micro_batches, 2);  // 512 = 8 x 32 x 2
  EXPECT_EQ(s->batch, 8 * 32);
  EXPECT_EQ(s->cluster.name, "dgx-a100");
  EXPECT_EQ(s->sim.precision, DType::bf16);
  EXPECT_EQ(s->metric, "tokens/s/GPU");
  EXPECT_EQ(s->published, 3000);
  EXPECT_FALSE(s->sim.fp8);
  // llm-foundry's amp_fp8 on H100s: the blocks' GEMMs in FP8 beside bf16.
  PublishedRun f8 = mosaic_like();
  f8.fields["gpu_type"] = "H100 80GB";
  f8.fields["precision"] = "amp_fp8";
  s = setup_run(f8);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->cluster.name, "dgx-h100");
  EXPECT_EQ(s->sim.precision, DType::bf16);
  EXPECT_TRUE(s->sim.fp8);
}

// Megatron-LM's README tables give model TFLOP/s per GPU (its own count: forward and backward
// once, no recomputation): a GPT row is compared on that count (megatron_model_flops over the
// predicted step); PaLM's 6N + 12lhs basis, and a model whose Megatron count differs (grouped
// queries, a gated MLP), are not read as it.
TEST(SetupRun, ReadsMegatronsModelTflopsOfAGpt) {
  PublishedRun r = mosaic_like();
  r.fields.erase("tokens_per_s_per_gpu");
  r.fields["model_name"] = "GPT-1.3B";
  r.fields["architecture"] = "GPT decoder";
  r.fields["layers"] = "24";
  r.fields["hidden"] = "2048";
  r.fields["heads"] = "16";
  r.fields["num_gpus"] = "8";
  r.fields["global_batch_seqs"] = "64";
  r.fields["zero_or_fsdp"] = "distributed optimizer";
  r.fields["framework"] = "Megatron-Core";
  r.fields["tflops_per_gpu"] = "150";
  r.fields["tflops_basis"] = "model FLOPs (MFU basis)";
  Result<RunSetup> s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->metric, "TFLOP/s/GPU (model)");
  EXPECT_EQ(s->published, 150);
  ValidationReport rep = validate_runs({r}, 2);
  ASSERT_EQ(rep.results.size(), 1u) << (rep.excluded.empty() ? "" : rep.excluded[0].reason);
  const RunResult& got = rep.results[0];
  const TransformerShape t{64, 2048, 24, 2048, static_cast<double>(got.setup.model.vocab_size)};
  EXPECT_NEAR(got.predicted, megatron_model_flops(t) / got.sim.step_seconds / 8 / 1e12,
              1e-9 * got.predicted);
  EXPECT_NEAR(got.error, got.predicted / 150 - 1, 1e-12);

  PublishedRun palm = r;
  palm.fields["tflops_basis"] = "model FLOPs incl. attention (6N + 12*L*d*s per token), MFU basis";
  EXPECT_FALSE(setup_run(palm).ok());
  PublishedRun llama = r;
  llama.fields["architecture"] = "LLaMA decoder";
  s = setup_run(llama);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("Megatron's model TFLOP/s of a GPT"), std::string::npos)
      << s.status().message();
}

// Megatron's overlap flags in a row's other_opts: --tp-comm-overlap overlaps the tensor-parallel
// collectives with their GEMMs and brings sequence parallelism (refused without it), so a
// partly filled row does not choose it; --overlap-param-gather hides ZeRO-1/2's parameter
// gathers behind the next forward. Without the flags, neither; without tensor ranks, no
// tensor-parallel overlap.
TEST(SetupRun, ReadsMegatronsOverlapFlags) {
  PublishedRun r = mosaic_like();
  r.fields["tp"] = "8";
  r.fields["zero_or_fsdp"] = "distributed optimizer";
  r.fields.erase("micro_batch");
  r.fields["other_opts"] = "--overlap-grad-reduce, --overlap-param-gather, --tp-comm-overlap";
  Result<RunSetup> s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE(s->sim.tp_comm_overlap);
  EXPECT_TRUE(s->sim.overlap_param_gather);
  EXPECT_TRUE(s->plan.sequence_parallel);
  EXPECT_EQ(std::count(s->unpublished.begin(), s->unpublished.end(), "sequence_parallel"), 0);
  EXPECT_TRUE(says(*s, "--tp-comm-overlap"));
  EXPECT_TRUE(says(*s, "--overlap-param-gather"));
  r.fields["other_opts"] = "";
  s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_FALSE(s->sim.tp_comm_overlap);
  EXPECT_FALSE(s->sim.overlap_param_gather);
  EXPECT_EQ(std::count(s->unpublished.begin(), s->unpublished.end(), "sequence_parallel"), 1);
  r.fields["tp"] = "1";
  r.fields["other_opts"] = "tp_comm_overlap";
  s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_FALSE(s->sim.tp_comm_overlap);
  EXPECT_FALSE(s->plan.sequence_parallel);
}

// A partly filled pipelined row of a framework that interleaves (Megatron-LM, Megatron-Core,
// NeMo) has its chunks per stage chosen too, among the planner's interleavings: never slower
// than the same row held to 1F1B. DeepSpeed's engine does not interleave; a published count is
// kept.
TEST(SetupRun, FillsAnInterleavedPipelinesChunksWhereTheFrameworkHasThem) {
  PublishedRun r = mosaic_like();
  r.fields["layers"] = "24";
  r.fields["tp"] = "2";
  r.fields["pp"] = "4";
  r.fields["zero_or_fsdp"] = "ZeRO-1";
  r.fields.erase("micro_batch");
  r.fields["framework"] = "Megatron-LM";
  auto has = [](const RunSetup& s, const char* knob) {
    return std::count(s.unpublished.begin(), s.unpublished.end(), knob) > 0;
  };
  Result<RunSetup> s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE(has(*s, "virtual_stages"));
  RunSetup filled = *s;
  Result<SimResult> best = fill_unpublished(&filled);
  ASSERT_TRUE(best.ok()) << best.status().to_string();
  const std::vector<int> choices = interleavings(24, 4);
  EXPECT_TRUE(filled.plan.virtual_stages == 1 ||
              std::count(choices.begin(), choices.end(), filled.plan.virtual_stages) == 1)
      << filled.plan.virtual_stages;
  ASSERT_EQ(filled.filled.size(), 1u);
  EXPECT_NE(filled.filled[0].find("virtual_stages"), std::string::npos) << filled.filled[0];
  PublishedRun one = r;
  one.fields["vp_interleave"] = "1";
  s = setup_run(one);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_FALSE(has(*s, "virtual_stages"));
  Result<SimResult> plain = fill_unpublished(&*s);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_LE(best->step_seconds, plain->step_seconds * (1 + 1e-12));
  PublishedRun ds = r;
  ds.fields["framework"] = "Megatron-DeepSpeed";
  s = setup_run(ds);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_FALSE(has(*s, "virtual_stages"));
}

// A node's network from the row's words: one rate, a count of links times theirs, Omni-Path's
// links; nothing without a rate.
TEST(SetupRun, ReadsTheNodesNetworkBandwidth) {
  for (const auto& [cell, want] : std::vector<std::pair<const char*, double>>{
           {"1600 Gbps node-node interconnect (RoCE)", 1600},
           {"2 Tb/s RoCE (per node)", 2000},
           {"400 Gbps + GPUDirect RDMA", 400},
           {"8x 400 Gb/s InfiniBand NDR per node (DGX H100 ref. arch.)", 3200},
           {"8x HDR InfiniBand 200Gb/s HCAs per node (+2 storage), 3-level fat tree", 1600},
           {"Intel Omni-Path, 4 links per node, non-blocking fat tree (Jean Zay)", 400}}) {
    double gbits = 0;
    EXPECT_TRUE(node_network_gbits(cell, &gbits)) << cell;
    EXPECT_DOUBLE_EQ(gbits, want) << cell;
  }
  double gbits = 0;
  EXPECT_FALSE(node_network_gbits("HDR InfiniBand (ConnectX-6, GPUDirect RDMA)", &gbits));
  EXPECT_FALSE(node_network_gbits("(not stated)", &gbits));
}

// Each GPU's NVLink links from the row's words, 25 GB/s each way per link; a generation or an
// aggregate rate is not a count and leaves the preset's links.
TEST(SetupRun, ReadsEachGpusNvlinkLinks) {
  EXPECT_EQ(device_nvlinks("NVLink (NVLink 4 inter-gpu connects per HF blog)"), 4);
  EXPECT_EQ(device_nvlinks("4 NVLink GPU-to-GPU interconnects"), 4);
  EXPECT_EQ(device_nvlinks("12 NVLink links per GPU"), 12);
  EXPECT_EQ(device_nvlinks("NVLink3 + NVSwitch (DGX A100)"), 0);
  EXPECT_EQ(device_nvlinks("NVLink4/NVSwitch 900 GB/s"), 0);
  EXPECT_EQ(device_nvlinks("NVSwitch (300 GB/s per paper)"), 0);
  EXPECT_EQ(device_nvlinks(""), 0);
  EXPECT_EQ(device_nvlinks("NVLink 99999999999999 links"), 0);  // not a count: no throw

  PublishedRun r = mosaic_like();
  Result<RunSetup> whole = setup_run(r);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_DOUBLE_EQ(whole->cluster.node.intra_bandwidth, 300e9);  // the preset's 12 links
  r.fields["intra_node_link"] = "NVLink (NVLink 4 inter-gpu connects per HF blog)";
  Result<RunSetup> four = setup_run(r);
  ASSERT_TRUE(four.ok()) << four.status().to_string();
  EXPECT_DOUBLE_EQ(four->cluster.node.intra_bandwidth, 100e9);
  EXPECT_TRUE(says(*four, "NVLink 4 links per GPU x 25 GB/s = 100 GB/s"));
}

// A row without its heads takes them from the row of the same source, architecture and width
// nearest its size, when the rows at that size agree; otherwise they stay unpublished (and
// setup_run guesses them).
TEST(SetupRun, BorrowsUnpublishedHeadsFromTheSameSourcesNearestRowOfThatWidth) {
  auto row = [](const char* id, const char* source, const char* arch, const char* billions,
                const char* heads) {
    PublishedRun r = mosaic_like();
    r.fields["row_id"] = id, r.fields["source_key"] = source, r.fields["architecture"] = arch;
    r.fields["hidden"] = "14400", r.fields["params_B"] = billions, r.fields["heads"] = heads;
    r.fields["tp"] = "8";
    return r;
  };
  std::vector<PublishedRun> table = {
      row("1", "log", "GPT decoder", "20", "32"),
      row("2", "log", "GPT decoder", "200", "96"),
      row("3", "log", "GPT decoder (candidate)", "194", ""),  // nearest 200B: 96
      row("4", "log", "GPT decoder", "21", ""),               // nearest 20B: 32
      row("5", "other", "GPT decoder", "194", ""),            // no row of its source
      row("6", "log", "MPT decoder", "194", ""),              // nor of its architecture
      row("7", "log2", "GPT decoder", "180", "64"),
      row("8", "log2", "GPT decoder", "180", "128"),
      row("9", "log2", "GPT decoder", "181", ""),  // the nearest disagree
      row("10", "log3", "GPT decoder", "50", "100"),
      row("11", "log3", "GPT decoder", "50", "")};  // 100 heads do not split over tp 8
  std::vector<PublishedRun> out = borrow_sibling_heads(table);
  EXPECT_EQ(out[2].at("heads"), "96");
  EXPECT_EQ(out[2].at(kHeadsFrom), "2");
  EXPECT_EQ(out[3].at("heads"), "32");
  EXPECT_EQ(out[4].at("heads"), "");
  EXPECT_EQ(out[5].at("heads"), "");
  EXPECT_EQ(out[8].at("heads"), "");
  EXPECT_EQ(out[10].at("heads"), "");
  EXPECT_EQ(out[1].at(kHeadsFrom), "");  // a row that gives them keeps them

  out[2].fields["layers"] = "80";
  Result<RunSetup> s = setup_run(out[2]);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->model.n_head, 96);
  EXPECT_TRUE(says(*s, "row 2 of the same source"));
}

// A run published before FlashAttention reached its framework is timed with the score matrix
// in memory (AttentionKernel::materialized), and says so; it takes longer than the fused kernel.
TEST(SetupRun, RunsBeforeFlashAttentionKeepTheScoreMatrix) {
  PublishedRun r = mosaic_like();
  r.fields["framework"] = "Megatron-LM";
  r.fields["source_year"] = "2021";
  Result<RunSetup> old = setup_run(r);
  ASSERT_TRUE(old.ok()) << old.status().to_string();
  EXPECT_EQ(old->sim.attention, AttentionKernel::materialized);
  EXPECT_TRUE(says(*old, "score matrix"));
  r.fields["source_year"] = "2023";
  Result<RunSetup> now = setup_run(r);
  ASSERT_TRUE(now.ok()) << now.status().to_string();
  EXPECT_EQ(now->sim.attention, AttentionKernel::fused);
  Result<SimResult> slow = simulate_setup(&*old), fast = simulate_setup(&*now);
  ASSERT_TRUE(slow.ok() && fast.ok());
  EXPECT_GT(slow->step_seconds, fast->step_seconds * 1.01);
}

// A pipelined row is cut into stages as its framework cuts them (DeepSpeed's engine: the
// fullest stage's count of blocks in turn, the head on top of the last stage's), and says so;
// a framework whose cut is not known is balanced by cost, which puts fewer blocks beside the
// head: the same row so cut runs faster.
TEST(SetupRun, PipelinedRowsAreCutAsTheirFrameworkCutsThem) {
  PublishedRun r = mosaic_like();
  r.fields["layers"] = "30";
  r.fields["vocab"] = "250880";  // a head the size of several blocks
  r.fields["pp"] = "4";
  r.fields["tp"] = "2";
  r.fields["zero_or_fsdp"] = "ZeRO-1";
  r.fields["micro_batch"] = "1";
  r.fields["framework"] = "Megatron-DeepSpeed";
  Result<RunSetup> ds = setup_run(r);
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  EXPECT_EQ(ds->plan.stage_layers, (std::vector<int>{8, 8, 8, 6}));
  EXPECT_TRUE(says(*ds, "blocks per pipeline chunk 8,8,8,6 as Megatron-DeepSpeed"));
  r.fields["framework"] = "torchtitan";
  Result<RunSetup> balanced = setup_run(r);
  ASSERT_TRUE(balanced.ok()) << balanced.status().to_string();
  EXPECT_TRUE(balanced->plan.stage_layers.empty());
  RunSetup by_cost = *ds;
  by_cost.plan.stage_layers.clear();
  Result<SimResult> cut = simulate_setup(&*ds), fast = simulate_setup(&by_cost);
  ASSERT_TRUE(cut.ok() && fast.ok());
  EXPECT_NE(cut->stage_layers, fast->stage_layers);
  EXPECT_GT(cut->step_seconds, fast->step_seconds * 1.01);
}

// A tensor-parallel row: dp = num_gpus / tp, the micro-batch split over dp only, and
// accumulation from the global batch over micro_batch x dp.
TEST(SetupRun, TensorParallelRowsSplitTheGpusIntoDataAndTensorAxes) {
  PublishedRun r = mosaic_like();
  r.fields["tp"] = "8";
  r.fields["zero_or_fsdp"] = "none";
  Result<RunSetup> s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->plan.tensor_group(), 8);
  EXPECT_EQ(s->plan.data_group(), 4);
  EXPECT_EQ(s->batch, 8 * 4);
  EXPECT_EQ(s->plan.micro_batches, 16);  // 512 = 8 x 4 x 16
}

// The table the frameworks train: a vocabulary whose rows per tensor rank are not a multiple
// of 8 is padded to a multiple of 128 x tp (Megatron-LM; llm.c's 50,304), an aligned one stays.
TEST(SetupRun, PadsAnUnalignedVocabularyAsTheFrameworksDo) {
  PublishedRun r = mosaic_like();
  Result<RunSetup> s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->model.vocab_rows(), 50368);  // 8 | 50368: as published
  r.fields["vocab"] = "50257";
  s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->model.vocab_size, 50257);
  EXPECT_EQ(s->model.vocab_rows(), 50304);
  EXPECT_TRUE(says(*s, "padded to 50304"));
  r.fields["tp"] = "8";
  r.fields["zero_or_fsdp"] = "none";
  r.fields["vocab"] = "50368";  // 6,296 rows per rank: aligned
  s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->model.vocab_rows(), 50368);
  r.fields["vocab"] = "50257";
  s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->model.vocab_rows(), 51200);  // 128 x 8 x 50
}

TEST(SetupRun, SaysWhyARowCannotBeModelled) {
  auto reason = [](std::map<std::string, std::string> changes) {
    PublishedRun r = mosaic_like();
    for (auto& [k, v] : changes) r.fields[k] = v;
    Result<RunSetup> s = setup_run(r);
    return s.ok() ? std::string("ok") : s.status().message();
  };
  EXPECT_NE(reason({{"tp", "3"}}).find("tp=3 x pp=1 does not divide num_gpus=32"),
            std::string::npos);
  EXPECT_EQ(reason({{"tp", "8"}, {"sequence_parallel", "yes"}}), "ok");
  EXPECT_NE(reason({{"tp", "2"}, {"dp", "32"}}).find("dp=32 x tp=2 x pp=1 on 32 GPUs"),
            std::string::npos);
  // Pipelines: ZeRO-3 (FSDP) with stages is refused with the reason; ZeRO-1 is modelled.
  EXPECT_NE(reason({{"pp", "4"}}).find("with pipeline parallelism is refused"), std::string::npos);
  EXPECT_EQ(reason({{"pp", "4"}, {"zero_or_fsdp", "ZeRO-1"}}), "ok");
  EXPECT_EQ(
      reason({{"pp", "4"}, {"tp", "2"}, {"sequence_parallel", "yes"}, {"zero_or_fsdp", "ZeRO-1"}}),
      "ok");
  EXPECT_NE(reason({{"pp", "3"}}).find("does not divide num_gpus=32"), std::string::npos);
  // FP8 on an A100 (no FP8 tensor cores) is refused; on an H100 its GEMMs are FP8.
  EXPECT_NE(reason({{"precision", "amp_fp8"}}).find("has no FP8 peak"), std::string::npos);
  EXPECT_EQ(reason({{"precision", "amp_fp8"}, {"gpu_type", "H100 80GB"}}), "ok");
  // Unpublished knobs are chosen later (fill_unpublished); a micro-batch needs the global
  // batch to be chosen from.
  EXPECT_EQ(reason({{"zero_or_fsdp", ""}, {"activation_recompute", ""}}), "ok");
  EXPECT_NE(reason({{"micro_batch", ""}, {"global_batch_seqs", ""}})
                .find("micro_batch not published (nor the global batch"),
            std::string::npos);
  EXPECT_EQ(reason({{"zero_or_fsdp", ""}}), "ok");
  EXPECT_NE(reason({{"num_gpus", "128-512"}}).find("num_gpus '128-512' is not a single number"),
            std::string::npos);
  EXPECT_EQ(reason({{"micro_batch", ""}}), "ok");
  EXPECT_NE(reason({{"layers", ""}}).find("layers not published (nor params_B"), std::string::npos);
  EXPECT_NE(reason({{"layers", ""}, {"params_B", "0.1"}}).find("do not make one block"),
            std::string::npos);
  EXPECT_NE(reason({{"global_batch_seqs", "500"}}).find("not a multiple"), std::string::npos);
  EXPECT_NE(reason({{"activation_recompute", "selective (every 2 blocks)"}}).find("some blocks"),
            std::string::npos);
  EXPECT_EQ(reason({{"activation_recompute", "selective"}}), "ok");
  EXPECT_NE(reason({{"gpu_type", "TPU v4"}}).find("no cluster preset"), std::string::npos);
  EXPECT_NE(reason({{"tokens_per_s_per_gpu", ""}}).find("no comparable metric"), std::string::npos);
}

// Context parallelism (NeMo's cp=2) is an axis of the plan, zigzag for LLaMA-style models;
// with pipeline stages it is refused by name. HSDP's spellings give shard groups (a node's
// data-parallel ranks when no degree is published).
TEST(SetupRun, ContextParallelAndHybridShardedRows) {
  PublishedRun r = mosaic_like();
  r.fields["cp"] = "2";
  Result<RunSetup> s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->plan.context_group(), 2);
  EXPECT_EQ(s->plan.data_group(), 16);
  EXPECT_EQ(s->plan.zero, 3);
  r.fields["architecture"] = "LLaMA decoder (GQA)";
  r.fields["model_name"] = "llama-like";
  s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->plan.context_order, ContextOrder::zigzag);
  // With pipeline stages too (NeMo's cp 2 x pp 4 rows).
  r.fields["pp"] = "2";
  r.fields["zero_or_fsdp"] = "ZeRO-1";
  s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->plan.context_group(), 2);
  EXPECT_EQ(s->plan.stages(), 2);

  PublishedRun h = mosaic_like();
  h.fields["zero_or_fsdp"] = "HYBRID_SHARD";
  h.fields["gpus_per_node"] = "8";
  s = setup_run(h);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE(s->plan.hsdp());
  EXPECT_EQ(s->plan.mesh.axis_size("dp_shard"), 8);
  h.fields["zero_or_fsdp"] = "FSDP2 dp_shard=16";
  s = setup_run(h);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->plan.mesh.axis_size("dp_shard"), 16);
  h.fields["zero_or_fsdp"] = "distributed optimizer";
  s = setup_run(h);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->plan.zero, 1);
  h.fields["zero_or_fsdp"] = "tensor-sliced magic";
  s = setup_run(h);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("is not a spelling Tessera knows"), std::string::npos);
}

// A GPT decoder row without its depth or heads: the depth whose blocks and embeddings come
// nearest the published size (MPT-7B: 32 blocks of 4096 make 6.65B parameters with its 50,368
// vocabulary, published as 6.7B), and 128-wide heads, or the count nearest them that divides
// the hidden size and splits over tp.
TEST(SetupRun, InfersTheDepthFromTheSizeAndTheHeadsFromTheWidth) {
  PublishedRun r = mosaic_like();
  r.fields["layers"] = "";
  r.fields["heads"] = "";
  r.fields["params_B"] = "6.7";
  Result<RunSetup> s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->model.n_layer, 32);
  EXPECT_EQ(s->model.n_head, 32);  // 4096 / 128
  r.fields["hidden"] = "14400";    // 112.5 heads of 128: 120 heads of 120 split over tp 8
  r.fields["params_B"] = "200";
  r.fields["tp"] = "8";
  r.fields["zero_or_fsdp"] = "ZeRO-1";
  s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->model.n_head, 120);
  EXPECT_EQ(s->model.n_layer, 80);  // 80 x 2.49B + 0.76B of embeddings
  int said = 0;
  for (const std::string& a : s->assumptions)
    said += a.rfind("layers = 80", 0) == 0 || a.rfind("heads = 120", 0) == 0;
  EXPECT_EQ(said, 2);
}

// A public model named without its dimensions takes its preset's (MT-NLG 530B: 105 blocks of
// 20480, 128 heads), and a GPT-style row without its vocabulary GPT-2's BPE; a name that is
// neither is refused as before.
TEST(SetupRun, PublicModelsResolveToTheirArchitecture) {
  PublishedRun r = mosaic_like();
  for (const char* k : {"layers", "hidden", "heads", "vocab"}) r.fields[k] = "";
  r.fields["model_name"] = "MT-NLG 530B";
  r.fields["architecture"] = "GPT decoder";
  Result<RunSetup> s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->model.n_layer, 105);
  EXPECT_EQ(s->model.n_embd, 20480);
  EXPECT_EQ(s->model.n_head, 128);
  EXPECT_EQ(s->model.vocab_size, 50257);
  r.fields["model_name"] = "Gopher";
  EXPECT_FALSE(setup_run(r).ok());
}

// Unpublished knobs are chosen as the planner would: the fastest plan that fits, with the
// published ones held. GPT-2 small on 8 A100s with a global batch of 64: with everything free
// the whole per-rank batch in one micro-batch, no recomputation (it fits); a device of 12 GiB
// forces smaller micro-batches or recomputation, and the choice fits it.
TEST(FillUnpublished, ChoosesTheFastestPlanThatFits) {
  PublishedRun r = mosaic_like();
  r.fields["model_name"] = "GPT-2 small";
  r.fields["architecture"] = "GPT-2";
  r.fields["layers"] = "12";
  r.fields["hidden"] = "768";
  r.fields["heads"] = "12";
  r.fields["seq_len"] = "1024";
  r.fields["vocab"] = "50257";
  r.fields["num_gpus"] = "8";
  r.fields["global_batch_seqs"] = "64";
  r.fields["micro_batch"] = "";
  r.fields["zero_or_fsdp"] = "";
  r.fields["activation_recompute"] = "";
  Result<RunSetup> s = setup_run(r);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_EQ(s->unpublished.size(), 3u);
  RunSetup roomy = *s;
  Result<SimResult> fast = fill_unpublished(&roomy);
  ASSERT_TRUE(fast.ok()) << fast.status().to_string();
  ASSERT_EQ(roomy.filled.size(), 1u);
  EXPECT_NE(roomy.filled[0].find("the fastest plan that fits"), std::string::npos);
  EXPECT_EQ(roomy.plan.recompute, RecomputePolicy::none);
  EXPECT_LE(fast->peak_memory_bytes, roomy.cluster.device.memory_bytes);
  // Every other choice of the three knobs is no faster among those that fit.
  for (int64_t mb : {1, 2, 4, 8})
    for (RecomputePolicy rc : {RecomputePolicy::none, RecomputePolicy::full}) {
      RunSetup k = *s;
      k.batch = mb * 8;
      k.plan.micro_batches = static_cast<int>(8 / mb);
      k.plan.recompute = rc;
      k.plan.zero = 1;
      Result<SimResult> r2 = simulate_setup(&k);
      ASSERT_TRUE(r2.ok()) << r2.status().to_string();
      if (r2->peak_memory_bytes <= k.cluster.device.memory_bytes) {
        EXPECT_GE(r2->step_seconds, fast->step_seconds * (1 - 1e-12)) << mb;
      }
    }
  RunSetup tight = *s;
  tight.cluster.device.memory_bytes = 12.0 * (1 << 30);
  Result<SimResult> fits = fill_unpublished(&tight);
  ASSERT_TRUE(fits.ok()) << fits.status().to_string();
  EXPECT_LE(fits->peak_memory_bytes, 12.0 * (1 << 30));
  EXPECT_GE(fits->step_seconds, fast->step_seconds);
}

TEST(Percentile, NearestRank) {
  EXPECT_EQ(percentile({5, 1, 3, 2, 4}, 0.5), 3);
  EXPECT_EQ(percentile({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.9), 9);
  EXPECT_EQ(percentile({7}, 0.9), 7);
  EXPECT_EQ(percentile({}, 0.5), 0);
}

// The shipped table (validation/published_runs.csv): every row is either simulated or listed
// with a reason, and on the data-parallel sources the error stays within the targets on rows
// the cluster presets were not fitted on: the A100 and H100 GEMM and attention efficiencies
// were fitted on llm-foundry's even row_ids (clusters/dgx-a100.toml, dgx-h100.toml), so only
// its odd rows, and IBM's rows, count. llm-foundry: median <= 10%, p90 <= 20%. IBM's four
// FSDP rows are predicted 14-21% slow since the simulator issues collectives in the runner's
// order (a ZeRO-3 gather no earlier than its start instruction, 16 MB of prefetch ahead of
// use; before, a wait could pull a stream's queue forward and the rows were within 9%):
// median <= 20%, p90 <= 25%.
TEST(Validation, ShippedTableMeetsTheTargetsOnHeldOutDataParallelRows) {
  Result<std::vector<PublishedRun>> runs =
      read_published_runs(std::string(TESSERA_SOURCE_DIR) + "/validation/published_runs.csv");
  ASSERT_TRUE(runs.ok()) << runs.status().to_string();
  EXPECT_EQ(runs->size(), 455u);
  for (const char* source : {"mosaic_llmfoundry_bench", "ibm_fsdp_max_2024"}) {
    ValidationReport rep = validate_runs(*runs, 2, source);
    const bool fitted_on_even = std::string(source) == "mosaic_llmfoundry_bench";
    std::vector<double> held_out;
    for (const RunResult& r : rep.results)
      if (!fitted_on_even || std::stoi(r.row_id) % 2 == 1) held_out.push_back(std::fabs(r.error));
    const double median = percentile(held_out, 0.5), p90 = percentile(held_out, 0.9);
    std::printf(
        "%s: %zu held-out rows of %zu simulated, %zu not modelled; median %.1f%%, "
        "p90 %.1f%%\n",
        source, held_out.size(), rep.results.size(), rep.excluded.size(), 100 * median, 100 * p90);
    EXPECT_GE(held_out.size(), 4u) << source;
    EXPECT_LE(median, fitted_on_even ? 0.10 : 0.20) << source;
    EXPECT_LE(p90, fitted_on_even ? 0.20 : 0.25) << source;
    for (const ExcludedRun& e : rep.excluded) EXPECT_FALSE(e.reason.empty()) << e.row_id;
  }
}

// Issue 46's bar over the whole shipped table: at least 360 rows with published plans
// modelled, their median error at most 5% and their p90 at most 20%.
TEST(Validation, ShippedTableMeetsTheTargetsOverTheRowsWithPublishedPlans) {
  Result<std::vector<PublishedRun>> runs =
      read_published_runs(std::string(TESSERA_SOURCE_DIR) + "/validation/published_runs.csv");
  ASSERT_TRUE(runs.ok()) << runs.status().to_string();
  ValidationReport rep = validate_runs(*runs, 2);
  const SourceStats* all = nullptr;
  for (const SourceStats& st : rep.stats)
    if (st.source == "all") all = &st;
  ASSERT_NE(all, nullptr);
  std::printf("%d rows with published plans: median %.1f%%, p90 %.1f%%\n", all->rows,
              100 * all->median, 100 * all->p90);
  EXPECT_GE(all->rows, 360);
  EXPECT_LE(all->median, 0.05);
  EXPECT_LE(all->p90, 0.20);
}

// A row whose published figure would need more than the device's peak (llm.c's GPT-3 125M line:
// 0.15 s for 524,288 tokens on 8 A100s, which its own table notes looks inconsistent with the
// 124M line's 0.3 s) is listed as inconsistent, not scored; its neighbours are scored.
TEST(Validation, ARowImplyingMoreThanThePeakIsListedNotScored) {
  Result<std::vector<PublishedRun>> runs =
      read_published_runs(std::string(TESSERA_SOURCE_DIR) + "/validation/published_runs.csv");
  ASSERT_TRUE(runs.ok()) << runs.status().to_string();
  ValidationReport rep = validate_runs(*runs, 2, "llmc_scripts");
  ASSERT_EQ(rep.excluded.size(), 1u);
  EXPECT_EQ(rep.excluded[0].row_id, "665");
  EXPECT_NE(rep.excluded[0].reason.find("implies 136% MFU"), std::string::npos)
      << rep.excluded[0].reason;
  EXPECT_EQ(rep.results.size(), 4u);
  for (const RunResult& r : rep.results) EXPECT_LT(r.sim.mfu, 1.0) << r.row_id;
}

// The published tensor-parallel rows without pipeline parallelism (Korthikanti et al. 2022,
// GPT 22B, tp 8: full recompute, 1.42 s per iteration; sequence parallelism with selective
// recompute, 1.10 s) are simulated with the Megatron layout the search finds.
TEST(Validation, TensorParallelRowIsSimulated) {
  Result<std::vector<PublishedRun>> runs =
      read_published_runs(std::string(TESSERA_SOURCE_DIR) + "/validation/published_runs.csv");
  ASSERT_TRUE(runs.ok()) << runs.status().to_string();
  ValidationReport rep = validate_runs(*runs, 2, "korthikanti2022");
  const RunResult* row = nullptr;
  for (const RunResult& r : rep.results)
    if (r.row_id == "29") row = &r;
  ASSERT_NE(row, nullptr) << "row 29 not simulated";
  EXPECT_EQ(row->setup.plan.tensor_group(), 8);
  EXPECT_EQ(row->setup.plan.params.at("h.0.attn.qkv.weight")[1], Placement::shard(0));
  // Row 29 is under-predicted (-20%): its step is the plain sum of its parts here (matmuls
  // 0.75 s, tensor-parallel all-reduces 0.18 s, nothing overlapped), so the gap is Megatron's
  // full recompute costing more than a second forward at the fitted matmul efficiency. (It
  // read -14% while one-rank data axes still had zero-byte all-reduces, whose waits queued
  // compute behind the tp all-reduces: a dependency the runtime does not have.)
  EXPECT_LT(std::fabs(row->error), 0.25) << row->predicted << " s vs " << row->setup.published;
  const RunResult* sp = nullptr;
  for (const RunResult& r : rep.results)
    if (r.row_id == "30") sp = &r;
  ASSERT_NE(sp, nullptr) << "row 30 (sequence parallel) not simulated";
  EXPECT_TRUE(sp->setup.plan.sequence_parallel);
  std::printf(
      "row 29: predicted %.3f s, published %.3f s; row 30 (SP + selective): predicted "
      "%.3f s, published %.3f s\n",
      row->predicted, row->setup.published, sp->predicted, sp->setup.published);
  // Sequence parallelism with selective recompute is faster than full recompute, as published.
  EXPECT_LT(sp->predicted, row->predicted);
}

// The report's second table: the rows with published plans by kind of plan, each row once
// (Korthikanti's: tensor parallel on one node, pipelines beyond it).
TEST(Validation, RowsAreAlsoTabledByKindOfPlan) {
  EXPECT_STREQ(plan_kind(Plan::data_parallel(8, 1)), "data parallel, ZeRO-0/1/2");
  EXPECT_STREQ(plan_kind(Plan::hybrid_sharded(2, 4)), "FSDP / ZeRO-3 / HSDP");
  EXPECT_STREQ(plan_kind(Plan::tensor_parallel(2, 4, 3)), "tensor parallel");
  EXPECT_STREQ(plan_kind(Plan::pipeline_parallel(2, 2, 2)), "pipeline");
  Plan ep = Plan::pipeline_parallel(2, 2, 1);
  ASSERT_TRUE(add_expert_axis(&ep, 2).ok());
  EXPECT_STREQ(plan_kind(ep), "context or expert parallel");
  Result<std::vector<PublishedRun>> runs =
      read_published_runs(std::string(TESSERA_SOURCE_DIR) + "/validation/published_runs.csv");
  ASSERT_TRUE(runs.ok()) << runs.status().to_string();
  ValidationReport rep = validate_runs(*runs, 2, "korthikanti2022");
  int published = 0, tabled = 0;
  for (const RunResult& r : rep.results) published += r.setup.filled.empty() ? 1 : 0;
  for (const SourceStats& k : rep.kinds) tabled += k.rows;
  EXPECT_EQ(tabled, published);
  ASSERT_EQ(rep.kinds.size(), 2u);
  EXPECT_EQ(rep.kinds[0].source, "tensor parallel");
  EXPECT_EQ(rep.kinds[1].source, "pipeline");
  EXPECT_NE(format_report(rep, false).find("by kind of plan"), std::string::npos);
}

// The published T5 row (Zhao et al. 2023, T5-11B under FSDP on A100s with 2 Tb/s RoCE per
// node: per-GPU throughput 7% lower on 512 GPUs than on 8) is simulated as the ratio of the two
// runs' per-GPU throughput, on the t5-11b preset.
TEST(Validation, T5ScalingRowIsSimulated) {
  Result<std::vector<PublishedRun>> runs =
      read_published_runs(std::string(TESSERA_SOURCE_DIR) + "/validation/published_runs.csv");
  ASSERT_TRUE(runs.ok()) << runs.status().to_string();
  ValidationReport rep = validate_runs(*runs, 2, "zhao2023fsdp");
  const RunResult* row = nullptr;
  for (const RunResult& r : rep.results)
    if (r.row_id == "215") row = &r;
  ASSERT_NE(row, nullptr) << "row 215 not simulated";
  EXPECT_EQ(row->setup.model.name, "t5-11b");
  EXPECT_EQ(row->setup.metric, "scaling eff. %");
  EXPECT_EQ(row->setup.scale_from_gpus, 8);
  EXPECT_EQ(row->sim.devices, 512);
  EXPECT_EQ(row->setup.plan.zero, 3);
  std::printf("row 215: predicted %.1f%% scaling efficiency 8 -> 512 GPUs, published %.0f%%\n",
              row->predicted, row->setup.published);
  // Communication only adds time going from one node to 64: at most 100%.
  EXPECT_GT(row->predicted, 50);
  EXPECT_LE(row->predicted, 100);
  EXPECT_LT(std::fabs(row->error), 0.25);
}

}  // namespace
}  // namespace tessera

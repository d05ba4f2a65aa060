// The ring collectives over the in-process transport: n ranks are n threads.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/local_comm.h"

namespace tessera {
namespace {

using Comms = std::vector<std::unique_ptr<Communicator>>;

void run_ranks(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
}

// Exactly representable test values, so any summation order gives the exact sum.
float value(int rank, int64_t i) { return static_cast<float>((rank + 1) * (i % 13) - 7 * rank); }

// The chunking documented in communicator.h, recomputed independently.
int64_t chunk_len(int64_t count, int n, int i) { return count / n + (i < count % n ? 1 : 0); }

const std::vector<int64_t> kCounts = {0, 1, 2, 3, 5, 7, 64, 1001};

TEST(Comm, AllReduceMatchesNaiveSum) {
  for (int n = 1; n <= 4; ++n) {
    Comms comms = make_local_comms(n);
    for (int64_t count : kCounts) {
      std::vector<float> expected(count, 0.f);
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < count; ++i) expected[i] += value(r, i);
      run_ranks(n, [&](int r) {
        std::vector<float> x(count);
        for (int64_t i = 0; i < count; ++i) x[i] = value(r, i);
        Communicator& c = *comms[r];
        ASSERT_TRUE(c.wait(c.all_reduce(x.data(), count, "t")).ok());
        EXPECT_EQ(x, expected) << "n=" << n << " count=" << count << " rank " << r;
      });
    }
  }
}

// bf16/f16 reductions are f32 reductions rounded once (inputs 1 + k 2^-7, exact in bf16, whose
// f32 sums are exact in any order), not sums rounded to bf16 after each hop (which differ for
// some elements: checked, so the test can tell them apart); and operations that only move data
// move the stored bytes (half the f32 bytes).
TEST(Comm, LowPrecisionIsReducedInF32AndMovedAsStored) {
  const int n = 4;
  Comms comms = make_local_comms(n);
  const int64_t count = 128;
  auto input = [](int r, int64_t i) {
    return 1.0f + static_cast<float>((i * 7 + r * 29) % 128) / 128;
  };
  std::vector<uint16_t> once(count);
  int hop_rounding_differs = 0;
  for (int64_t i = 0; i < count; ++i) {
    float exact = 0, hops = 0;
    for (int q = 0; q < n; ++q) {
      exact += input(q, i);
      hops = bf16_to_f32(f32_to_bf16(hops + input(q, i)));
    }
    once[i] = f32_to_bf16(exact);
    hop_rounding_differs += bf16_to_f32(once[i]) != hops;
  }
  ASSERT_GT(hop_rounding_differs, 0);
  run_ranks(n, [&](int r) {
    Communicator& c = *comms[r];
    std::vector<uint16_t> x(count);
    for (int64_t i = 0; i < count; ++i) x[i] = f32_to_bf16(input(r, i));
    ASSERT_TRUE(c.wait(c.all_reduce(x.data(), count, DType::bf16, "bf16")).ok());
    EXPECT_EQ(x, once) << "rank " << r;
    std::vector<uint16_t> in(n * count), out(count), all(n * count);
    for (int64_t i = 0; i < n * count; ++i) in[i] = f32_to_f16(value(r, i));
    ASSERT_TRUE(c.wait(c.reduce_scatter(in.data(), out.data(), count, DType::f16, "rs")).ok());
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += value(q, r * count + i);
      EXPECT_EQ(f16_to_f32(out[i]), want);
    }
    c.reset_stats();
    ASSERT_TRUE(c.wait(c.all_gather(in.data(), all.data(), count, DType::f16, "ag")).ok());
    EXPECT_EQ(c.stats().bytes_sent, (n - 1) * count * 2);
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < count; ++i) EXPECT_EQ(all[q * count + i], f32_to_f16(value(q, i)));
  });
}

TEST(Comm, AllReduceIsBitwiseIdenticalAndDeterministic) {
  for (int n = 2; n <= 4; ++n) {
    Comms comms = make_local_comms(n);
    const int64_t count = 1003;
    std::vector<std::vector<float>> inputs(n, std::vector<float>(count));
    for (int r = 0; r < n; ++r) {
      std::mt19937 gen(r + 17);
      std::uniform_real_distribution<float> dist(-1.f, 1.f);
      for (auto& v : inputs[r]) v = dist(gen) * std::pow(10.f, static_cast<float>(r % 3));
    }
    std::vector<std::vector<float>> first;
    for (int run = 0; run < 2; ++run) {
      std::vector<std::vector<float>> out = inputs;
      run_ranks(n, [&](int r) {
        ASSERT_TRUE(comms[r]->wait(comms[r]->all_reduce(out[r].data(), count, "rand")).ok());
      });
      for (int r = 1; r < n; ++r)
        EXPECT_EQ(std::memcmp(out[r].data(), out[0].data(), count * 4), 0) << "rank " << r;
      for (int64_t i = 0; i < count; ++i) {
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += inputs[r][i];
        EXPECT_NEAR(out[0][i], sum, 1e-4 * (1 + std::abs(sum)));
      }
      if (run == 0)
        first = out;
      else
        EXPECT_EQ(std::memcmp(out[0].data(), first[0].data(), count * 4), 0) << "rerun";
    }
  }
}

TEST(Comm, ReduceScatterMatchesNaiveSum) {
  for (int n = 1; n <= 4; ++n) {
    Comms comms = make_local_comms(n);
    for (int64_t count : kCounts) {
      run_ranks(n, [&](int r) {
        std::vector<float> in(n * count), out(count, -1.f);
        for (int64_t i = 0; i < n * count; ++i) in[i] = value(r, i);
        Communicator& c = *comms[r];
        ASSERT_TRUE(c.wait(c.reduce_scatter(in.data(), out.data(), count, "rs")).ok());
        for (int64_t i = 0; i < count; ++i) {
          float want = 0;
          for (int q = 0; q < n; ++q) want += value(q, r * count + i);
          ASSERT_EQ(out[i], want) << "n=" << n << " count=" << count << " rank " << r;
        }
      });
    }
  }
}

TEST(Comm, AllGatherCollectsBlocksInRankOrder) {
  for (int n = 1; n <= 4; ++n) {
    Comms comms = make_local_comms(n);
    for (int64_t count : kCounts) {
      run_ranks(n, [&](int r) {
        std::vector<float> in(count), out(n * count, -1.f);
        for (int64_t i = 0; i < count; ++i) in[i] = value(r, i);
        Communicator& c = *comms[r];
        ASSERT_TRUE(c.wait(c.all_gather(in.data(), out.data(), count, "ag")).ok());
        for (int q = 0; q < n; ++q)
          for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out[q * count + i], value(q, i));
      });
    }
  }
}

// Block j of rank r's input lands in block r of rank j's output; the bytes each rank sends are
// the n - 1 blocks it does not keep (communicator.h).
TEST(Comm, AllToAllSwapsBlocksBetweenRanks) {
  for (int n = 1; n <= 4; ++n) {
    Comms comms = make_local_comms(n);
    for (int64_t count : kCounts) {
      run_ranks(n, [&](int r) {
        std::vector<float> in(n * count), out(n * count, -1.f);
        for (int64_t i = 0; i < n * count; ++i) in[i] = value(r, i);
        Communicator& c = *comms[r];
        c.reset_stats();
        ASSERT_TRUE(c.wait(c.all_to_all(in.data(), out.data(), count, DType::f32, "a2a")).ok());
        for (int q = 0; q < n; ++q)
          for (int64_t i = 0; i < count; ++i)
            ASSERT_EQ(out[q * count + i], value(q, r * count + i)) << "n=" << n << " from " << q;
        EXPECT_EQ(c.stats().bytes_sent, (n - 1) * count * 4);
      });
    }
  }
}

TEST(Comm, BroadcastFromEveryRoot) {
  for (int n = 1; n <= 4; ++n) {
    Comms comms = make_local_comms(n);
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{300000}}) {
      for (int root = 0; root < n; ++root) {
        run_ranks(n, [&](int r) {
          std::vector<float> x(count);
          for (int64_t i = 0; i < count; ++i) x[i] = value(r, i);
          Communicator& c = *comms[r];
          ASSERT_TRUE(c.wait(c.broadcast(x.data(), count, root, "bc")).ok());
          for (int64_t i = 0; i < count; ++i) ASSERT_EQ(x[i], value(root, i)) << "root " << root;
        });
      }
    }
  }
}

TEST(Comm, ManyRequestsInFlightThenWaitedInOrder) {
  const int n = 3;
  const int64_t count = 101;
  Comms comms = make_local_comms(n);
  run_ranks(n, [&](int r) {
    Communicator& c = *comms[r];
    std::vector<std::vector<float>> bufs(5, std::vector<float>(count));
    std::vector<Request> reqs;
    for (int b = 0; b < 5; ++b) {
      for (int64_t i = 0; i < count; ++i) bufs[b][i] = value(r, i + b);
      reqs.push_back(c.all_reduce(bufs[b].data(), count, "bucket " + std::to_string(b)));
    }
    std::vector<float> g_in(count), g_out(n * count), b_x(count);
    for (int64_t i = 0; i < count; ++i) g_in[i] = b_x[i] = value(r, i);
    reqs.push_back(c.all_gather(g_in.data(), g_out.data(), count, "gather"));
    reqs.push_back(c.broadcast(b_x.data(), count, 2, "bcast"));
    for (auto& q : reqs) ASSERT_TRUE(c.wait(q).ok());
    ASSERT_TRUE(c.wait(reqs[0]).ok()) << "waiting twice returns the same status";
    for (int b = 0; b < 5; ++b)
      for (int64_t i = 0; i < count; ++i)
        ASSERT_EQ(bufs[b][i], value(0, i + b) + value(1, i + b) + value(2, i + b));
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(g_out[count + i], value(1, i));
      ASSERT_EQ(b_x[i], value(2, i));
    }
  });
}

TEST(Comm, SplitIntoTwoByTwoMesh) {
  const int n = 4;
  Comms comms = make_local_comms(n);
  run_ranks(n, [&](int r) {
    Communicator& world = *comms[r];
    const int row = r / 2, col = r % 2;
    auto tp = world.split(row, col, "tp");                // the ranks of my row
    auto dp = world.split(col, row, "dp");                // the ranks of my column
    auto none = world.split(r == 0 ? -1 : 0, -r, "rev");  // rank 0 out; the rest reversed
    ASSERT_TRUE(tp.ok() && dp.ok() && none.ok());
    Communicator& t = **tp;
    Communicator& d = **dp;
    EXPECT_EQ(t.size(), 2);
    EXPECT_EQ(t.rank(), col);
    EXPECT_EQ(t.name(), "tp");
    EXPECT_EQ(t.world_rank(1 - col), row * 2 + 1 - col);
    EXPECT_EQ(d.rank(), row);
    EXPECT_EQ(d.world_rank(1 - row), (1 - row) * 2 + col);
    if (r == 0) {
      EXPECT_EQ(*none, nullptr);
    } else {
      ASSERT_NE(*none, nullptr);
      EXPECT_EQ((*none)->size(), 3);
      EXPECT_EQ((*none)->rank(), 3 - r);  // key -r: world 3 first
    }
    // Collectives on both axes in flight at once.
    const int64_t count = 9;
    std::vector<float> a(count), b(count);
    for (int64_t i = 0; i < count; ++i) a[i] = b[i] = value(r, i);
    Request ra = t.all_reduce(a.data(), count, "tp sum");
    Request rb = d.all_reduce(b.data(), count, "dp sum");
    ASSERT_TRUE(t.wait(ra).ok());
    ASSERT_TRUE(d.wait(rb).ok());
    for (int64_t i = 0; i < count; ++i) {
      EXPECT_EQ(a[i], value(row * 2, i) + value(row * 2 + 1, i));
      EXPECT_EQ(b[i], value(col, i) + value(2 + col, i));
    }
    auto m = d.all_reduce_scalar(r, /*max=*/true, "dp max");
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(*m, 2 + col);
    if (*none) {
      std::vector<float> g(3), mine = {static_cast<float>(r)};
      Communicator& v = **none;
      ASSERT_TRUE(v.wait(v.all_gather(mine.data(), g.data(), 1, "rev gather")).ok());
      EXPECT_EQ(g, (std::vector<float>{3, 2, 1}));
    }
    EXPECT_EQ(t.stats().collectives, 1);
    EXPECT_EQ(d.stats().collectives, 2);
  });
}

// Review R10: a collective on one axis must not queue behind another axis's. Rank 0 issues a
// "dp" all-reduce first and a "tp" one second; rank 1 joins the dp one only after its tp one
// has finished. With one comm thread per process, rank 0's tp all-reduce would wait behind
// its dp one, which waits for rank 1, which waits for the tp one: a deadlock (here a timeout).
TEST(Comm, AxesDoNotQueueBehindEachOther) {
  const int n = 2;
  Comms comms = make_local_comms(n);
  std::vector<Status> tp_done(n), dp_done(n);
  run_ranks(n, [&](int r) {
    auto dp = comms[r]->split(0, r, "dp");
    auto tp = comms[r]->split(0, r, "tp");
    ASSERT_TRUE(dp.ok() && tp.ok());
    Communicator& d = **dp;
    Communicator& t = **tp;
    d.set_timeout(5);
    t.set_timeout(5);
    std::vector<float> a(1000, 1.f), b(1000, 1.f);
    if (r == 0) {
      Request rd = d.all_reduce(a.data(), 1000, "grad bucket 0");
      Request rt = t.all_reduce(b.data(), 1000, "tp activation");
      tp_done[r] = t.wait(rt);
      dp_done[r] = d.wait(rd);
    } else {
      tp_done[r] = t.wait(t.all_reduce(b.data(), 1000, "tp activation"));
      dp_done[r] = d.wait(d.all_reduce(a.data(), 1000, "grad bucket 0"));
    }
    EXPECT_EQ(a[999], 2.f);
    EXPECT_EQ(b[999], 2.f);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(tp_done[r].ok()) << tp_done[r].to_string();
    EXPECT_TRUE(dp_done[r].ok()) << dp_done[r].to_string();
  }
}

TEST(Comm, BytesSentMatchRingFormula) {
  for (int n = 1; n <= 4; ++n) {
    Comms comms = make_local_comms(n);
    for (int64_t count : {int64_t{1}, int64_t{3}, int64_t{5}, int64_t{1001}}) {
      run_ranks(n, [&](int r) {
        Communicator& c = *comms[r];
        std::vector<float> x(n * count, 1.f), y(n * count);
        const int next = (r + 1) % n, prev = (r + n - 1) % n;
        c.reset_stats();
        ASSERT_TRUE(c.wait(c.all_reduce(x.data(), count, "ar")).ok());
        CommStats s = c.stats();
        EXPECT_EQ(s.bytes_sent,
                  n == 1 ? 0 : 8 * count - 4 * (chunk_len(count, n, r) + chunk_len(count, n, next)))
            << "all_reduce n=" << n << " count=" << count << " rank " << r;
        EXPECT_EQ(
            s.bytes_received,
            n == 1 ? 0 : 8 * count - 4 * (chunk_len(count, n, r) + chunk_len(count, n, prev)));
        EXPECT_EQ(s.collectives, 1);

        c.reset_stats();
        ASSERT_TRUE(c.wait(c.reduce_scatter(x.data(), y.data(), count, "rs")).ok());
        EXPECT_EQ(c.stats().bytes_sent, (n - 1) * count * 4) << "reduce_scatter";

        c.reset_stats();
        ASSERT_TRUE(c.wait(c.all_gather(x.data(), y.data(), count, "ag")).ok());
        EXPECT_EQ(c.stats().bytes_sent, (n - 1) * count * 4) << "all_gather";
        EXPECT_EQ(c.stats().bytes_received, (n - 1) * count * 4);

        const int root = n - 1;
        c.reset_stats();
        ASSERT_TRUE(c.wait(c.broadcast(x.data(), count, root, "bc")).ok());
        const bool last_in_chain = (r + 1) % n == root;
        EXPECT_EQ(c.stats().bytes_sent, n == 1 || last_in_chain ? 0 : count * 4) << "broadcast";
        EXPECT_EQ(c.stats().bytes_received, r == root ? 0 : count * 4);
        EXPECT_GE(c.stats().wait_seconds, 0.0);
      });
    }
  }
}

TEST(Comm, ScalarAndBarrier) {
  const int n = 3;
  Comms comms = make_local_comms(n);
  run_ranks(n, [&](int r) {
    Communicator& c = *comms[r];
    auto sum = c.all_reduce_scalar(r + 0.5, false, "loss");
    auto max = c.all_reduce_scalar(r + 0.5, true, "max");
    ASSERT_TRUE(sum.ok() && max.ok());
    EXPECT_EQ(*sum, 4.5);
    EXPECT_EQ(*max, 2.5);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(c.barrier("sync").ok());
    if (r != 1) {
      EXPECT_GT(c.stats().wait_seconds, 0.02) << "waited for the late rank";
    }
  });
}

TEST(Comm, DeadPeerTimesOutNamingRankAndOperation) {
  const int n = 4;
  Comms comms = make_local_comms(n);
  for (auto& c : comms) c->set_timeout(0.5);
  kill_local_rank(*comms[1]);
  std::vector<Status> results(n);
  std::vector<double> took(n);
  run_ranks(n, [&](int r) {
    std::vector<float> x(1000, 1.f);
    auto start = std::chrono::steady_clock::now();
    results[r] = comms[r]->wait(comms[r]->all_reduce(x.data(), 1000, "grad bucket 3"));
    took[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_LT(took[r], 15.0) << "rank " << r;  // 0.5 s timeout: it fires, even on a busy machine
    EXPECT_NE(results[r].message().find("'grad bucket 3'"), std::string::npos);
    EXPECT_NE(results[r].message().find("timed out after 0.5 s in all_reduce"), std::string::npos)
        << results[r].to_string();
  }
  // Rank 2 receives from rank 1: it names the dead rank.
  const Status& s = results[2];
  std::printf("rank 2 reported: %s\n", s.to_string().c_str());
  EXPECT_NE(s.message().find("rank 2: timed out"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("(axis world, 4 ranks, "), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("waiting for data from rank 1"), std::string::npos) << s.to_string();
  EXPECT_NE(s.hint().find("rank 1 died or is stuck"), std::string::npos) << s.to_string();
  // The communicator is unusable afterwards; later operations fail at once.
  std::vector<float> y(4);
  Status again = comms[2]->wait(comms[2]->all_reduce(y.data(), 4, "next"));
  EXPECT_NE(again.message().find("'next' (axis world) not run: an earlier collective failed"),
            std::string::npos)
      << again.to_string();
}

TEST(Comm, DeadPeerOnSubCommunicatorIsNamedByWorldRank) {
  const int n = 4;
  Comms comms = make_local_comms(n);
  std::vector<Status> results(n);
  run_ranks(n, [&](int r) {
    auto dp = comms[r]->split(r % 2, r / 2, "dp");  // {0,2} and {1,3}
    ASSERT_TRUE(dp.ok());
    (*dp)->set_timeout(0.3);
    if (r == 3) kill_local_rank(**dp);
    std::vector<float> x(10, 1.f);
    results[r] = (*dp)->wait((*dp)->all_reduce(x.data(), 10, "grad bucket 0"));
  });
  EXPECT_TRUE(results[0].ok());
  EXPECT_TRUE(results[2].ok());
  EXPECT_NE(results[1].message().find("rank 1: timed out after 0.3 s in all_reduce 'grad bucket "
                                      "0' (axis dp, 2 ranks, 40 B) waiting for data from rank 3"),
            std::string::npos)
      << results[1].to_string();
}

TEST(Comm, MismatchedCountsAreAnErrorNotACrash) {
  const int n = 2;
  Comms comms = make_local_comms(n);
  std::vector<Status> results(n);
  run_ranks(n, [&](int r) {
    comms[r]->set_timeout(0.5);
    std::vector<float> x(6, 1.f);
    results[r] = comms[r]->wait(comms[r]->all_reduce(x.data(), r == 0 ? 4 : 6, "mismatch"));
  });
  EXPECT_FALSE(results[0].ok());
  EXPECT_FALSE(results[1].ok());
  EXPECT_NE(results[0].message().find("but expected"), std::string::npos) << results[0].to_string();
}

}  // namespace
}  // namespace tessera

// Point-to-point send/recv over the in-process transport: n ranks are n threads.
#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "comm/comm_internal.h"
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

// A pipeline's traffic: every rank sends to both neighbours before it receives from either, so
// an implementation that completed sends in issue order, one at a time, would deadlock.
TEST(P2P, NeighboursExchangeBothWaysAtOnce) {
  const int n = 4, count = 1000, rounds = 5;
  Comms comms = make_local_comms(n);
  std::vector<Status> failures(n);
  run_ranks(n, [&](int r) {
    Communicator& c = *comms[r];
    c.set_timeout(30);
    for (int k = 0; k < rounds; ++k) {
      std::vector<float> up(count), down(count), from_below(count, -1), from_above(count, -1);
      for (int i = 0; i < count; ++i) up[i] = down[i] = float(100 * r + k + i % 7);
      std::vector<Request> reqs;
      if (r + 1 < n) reqs.push_back(c.send(up.data(), count, r + 1, 0, "activation"));
      if (r > 0) reqs.push_back(c.send(down.data(), count, r - 1, 1, "gradient"));
      if (r > 0) reqs.push_back(c.recv(from_below.data(), count, r - 1, 0, "activation"));
      if (r + 1 < n) reqs.push_back(c.recv(from_above.data(), count, r + 1, 1, "gradient"));
      for (const Request& q : reqs) {
        Status s = c.wait(q);
        if (!s.ok()) failures[r] = s;
      }
      for (int i = 0; i < count; ++i) {
        if (r > 0) {
          ASSERT_EQ(from_below[i], float(100 * (r - 1) + k + i % 7));
        }
        if (r + 1 < n) {
          ASSERT_EQ(from_above[i], float(100 * (r + 1) + k + i % 7));
        }
      }
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(failures[r].ok()) << failures[r].to_string();
  // Bytes are counted: rank 1 sent 2 messages per round.
  EXPECT_EQ(comms[1]->stats().bytes_sent, 2 * rounds * count * 4);
  EXPECT_EQ(comms[1]->stats().bytes_received, 2 * rounds * count * 4);
}

// Same peer and tag: received in the order sent, whatever order the receives are waited in.
TEST(P2P, SameTagKeepsOrderAndTagsDoNotMix) {
  Comms comms = make_local_comms(2);
  run_ranks(2, [&](int r) {
    Communicator& c = *comms[r];
    const std::vector<float> a{1, 2}, b{3, 4}, z{9, 9};
    if (r == 0) {
      Request q1 = c.send(a.data(), 2, 1, 5, "a");
      Request q2 = c.send(b.data(), 2, 1, 5, "b");
      Request q3 = c.send(z.data(), 2, 1, 6, "z");
      EXPECT_TRUE(c.wait(q3).ok());
      EXPECT_TRUE(c.wait(q1).ok());
      EXPECT_TRUE(c.wait(q2).ok());
    } else {
      std::vector<float> x(2), y(2), w(2);
      Request qz = c.recv(w.data(), 2, 0, 6, "z");
      Request q1 = c.recv(x.data(), 2, 0, 5, "first");
      Request q2 = c.recv(y.data(), 2, 0, 5, "second");
      EXPECT_TRUE(c.wait(q2).ok());
      EXPECT_TRUE(c.wait(q1).ok());
      EXPECT_TRUE(c.wait(qz).ok());
      EXPECT_EQ(x, a);
      EXPECT_EQ(y, b);
      EXPECT_EQ(w, z);
    }
  });
}

// Receives of one key match messages in the order they were posted, whichever is tested first
// (MPI's rule; a pipeline posts the next micro-batch's receive ahead of the current one's).
TEST(P2P, LocalTransportMatchesReceivesInPostingOrder) {
  Comms comms = make_local_comms(2);
  detail::Transport* t0 = detail::transport_of(*comms[0]);
  detail::Transport* t1 = detail::transport_of(*comms[1]);
  float first = 1, second = 2, a = 0, b = 0;
  const auto ha = t1->irecv(0, 0, 9, &a, 4);
  const auto hb = t1->irecv(0, 0, 9, &b, 4);
  Status err;
  EXPECT_EQ(t0->test(t0->isend(0, 1, 9, &first, 4), &err), 1);
  EXPECT_EQ(t1->test(hb, &err), 0) << "the later receive took the first message";
  EXPECT_EQ(t1->test(ha, &err), 1);
  EXPECT_EQ(t0->test(t0->isend(0, 1, 9, &second, 4), &err), 1);
  EXPECT_EQ(t1->test(hb, &err), 1);
  EXPECT_EQ(a, 1.f);
  EXPECT_EQ(b, 2.f);
}

// On a split communicator, peers are local ranks and messages name world ranks.
TEST(P2P, DeadPeerTimesOutNamingTheRecvAndThePeer) {
  const int n = 4;
  Comms comms = make_local_comms(n);
  std::vector<Status> results(n);
  run_ranks(n, [&](int r) {
    auto pp = comms[r]->split(r % 2, r / 2, "pp");  // {0, 2} and {1, 3}
    ASSERT_TRUE(pp.ok());
    (*pp)->set_timeout(0.3);
    if (r == 3) kill_local_rank(**pp);
    std::vector<float> x(10, 1.f);
    Communicator& c = **pp;
    if (c.rank() == 1) {
      results[r] = c.wait(c.send(x.data(), 10, 0, 2, "activation chunk 1 mb 0"));
    } else {
      results[r] = c.wait(c.recv(x.data(), 10, 1, 2, "activation chunk 1 mb 0"));
    }
  });
  EXPECT_TRUE(results[0].ok()) << results[0].to_string();
  EXPECT_TRUE(results[2].ok()) << results[2].to_string();
  ASSERT_FALSE(results[1].ok());
  EXPECT_NE(results[1].message().find("rank 1: recv 'activation chunk 1 mb 0' (axis pp, 40 B) "
                                      "from rank 3 timed out after 0."),
            std::string::npos)
      << results[1].to_string();
  EXPECT_NE(results[1].hint().find("rank 3 died or is stuck"), std::string::npos);
  // Later operations of the process fail at once, naming the first failure.
  std::vector<float> y(4);
  Status again = comms[1]->wait(comms[1]->all_reduce(y.data(), 4, "next"));
  EXPECT_NE(again.message().find("an earlier collective failed"), std::string::npos)
      << again.to_string();
}

TEST(P2P, MismatchedSizesAreAnError) {
  Comms comms = make_local_comms(2);
  std::vector<Status> results(2);
  run_ranks(2, [&](int r) {
    Communicator& c = *comms[r];
    c.set_timeout(0.5);
    std::vector<float> x(8, 1.f);
    results[r] = r == 0 ? c.wait(c.send(x.data(), 8, 1, 0, "big"))
                        : c.wait(c.recv(x.data(), 4, 0, 0, "small"));
  });
  ASSERT_FALSE(results[1].ok());
  EXPECT_NE(results[1].message().find("recv 'small'"), std::string::npos) << results[1].to_string();
  EXPECT_NE(results[1].message().find("but expected 16"), std::string::npos)
      << results[1].to_string();
}

}  // namespace
}  // namespace tessera

// Attention, causal (decoders) or bidirectional (encoders, cross-attention), one (batch,
// kv-head) group per task: q [B,H,Tq,D], k/v [B,Hkv,Tk,D]; query head h reads kv head
// h / (H / Hkv); an optional bias [H,Tq,Tk] (T5's relative positions) is added to every
// example's scores. The forward saves the log-sum-exp per query row so the backward recomputes
// probabilities without storing the Tq x Tk matrix. Each head's products (Q K^T, P V and the
// five of the backward) are single-threaded OpenBLAS calls on a Tq x Tk scratch; the tasks run
// on the backend's threads.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/vec_math.h"
#include "ir/position_buckets.h"

namespace tessera::cpu {

namespace {

struct Dims {
  int64_t bsz, h, tq, tk, d, hkv, group;
  bool causal;
  int64_t block = 0, zigzag = 0;  // the queries' sequence chunk (op.h; 0 and 0 without one)
  int64_t key_block = -1;         // the keys' chunk (ring attention), or -1: keys 0..tk-1
  // Query row i's position in the sequence (sequence_position: increasing in i).
  int64_t position(int64_t i) const { return sequence_position(i, block, tq, zigzag); }
  // How many keys sit at positions <= p: a prefix, as key positions increase too.
  int64_t keys_upto(int64_t p) const {
    return key_block < 0 ? rows_before(p + 1, 0, tk, 0) : rows_before(p + 1, key_block, tk, zigzag);
  }
  // Query row i attends to keys [0, row_end(i)) (none, on a chunk of later keys).
  int64_t row_end(int64_t i) const { return causal ? keys_upto(position(i)) : tk; }
  // Query rows [i0, i1) together attend to keys [0, block_end(i1)).
  int64_t block_end(int64_t i1) const { return causal ? keys_upto(position(i1 - 1)) : tk; }
};

// `forward_inputs`: 3 (attention) or 6 (attention_grad), before the optional bias and block.
Dims dims_of(const Args& a, size_t forward_inputs) {
  const Shape &sq = a.in_shape(0), &sk = a.in_shape(1);
  const OptionalInputs opt = optional_inputs(a.in_types, forward_inputs);
  const AttentionAttrs& at = a.attr<AttentionAttrs>();
  Dims z{sq[0], sq[1], sq[2], sk[2], sq[3], sk[1], sq[1] / sk[1], at.causal};
  if (opt.block >= 0) {  // (zigzag only with a block)
    z.block = static_cast<int64_t>(a.iin(opt.block)[0]);
    z.zigzag = at.zigzag;
  }
  if (opt.key_block >= 0) z.key_block = static_cast<int64_t>(a.iin(opt.key_block)[0]);
  return z;
}

const float* bias_of(const Args& a, size_t forward_inputs) {
  const int bias = optional_inputs(a.in_types, forward_inputs).bias;
  return bias >= 0 ? a.fin(bias) : nullptr;
}

// Query rows are taken in blocks of kBlock: causal, block [i0, i1) only meets keys
// [0, block_end(i1)) ([0, i1) without a sequence block),
// so the products skip the blocks above the diagonal (at T = 256, 5/8 of the square is
// computed).
constexpr int64_t kBlock = 64;

// scale * S (+ the bias rows) in place for rows [i0, i1) and columns [0, keys) of one head;
// s and bias have row stride tk (bias: this head's [Tq, Tk] matrix, or null).
void scale_and_bias(const Dims& z, float* s, const float* bias, float scale, int64_t i0, int64_t i1,
                    int64_t keys) {
  for (int64_t i = i0; i < i1; ++i) {
    float* row = s + i * z.tk;
    const float* br = bias ? bias + i * z.tk : nullptr;
    if (br) {
#pragma omp simd
      for (int64_t j = 0; j < keys; ++j) row[j] = row[j] * scale + br[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < keys; ++j) row[j] *= scale;
    }
  }
}

// Probabilities of rows [i0, i1) of one head in place: s (row stride tk) holds the scores for
// columns [0, z.block_end(i1)) on entry; on exit p = exp(s - lse) for j < z.row_end(i) and 0
// for the rest of those columns.
void softmax_rows(const Dims& z, float* s, int64_t i0, int64_t i1, float* lse) {
  for (int64_t i = i0; i < i1; ++i) {
    float* row = s + i * z.tk;
    const int64_t n = z.row_end(i);
    if (n == 0) {  // every key of this chunk comes later: no probability, lse -inf
      std::fill(row, row + z.block_end(i1), 0.0f);
      lse[i] = -std::numeric_limits<float>::infinity();
      continue;
    }
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) m = std::max(m, row[j]);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      row[j] = exp_fast(row[j] - m);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    for (int64_t j = n; j < z.block_end(i1); ++j) row[j] = 0.0f;
    lse[i] = m + std::log(sum);
  }
}

}  // namespace

void position_buckets(const Args& a) {
  const PositionBucketsAttrs& p = a.attr<PositionBucketsAttrs>();
  int32_t* out = static_cast<int32_t*>(a.out[0]);
  for (int64_t i = 0; i < p.tq; ++i)
    for (int64_t j = 0; j < p.tk; ++j)
      out[i * p.tk + j] = t5_position_bucket(i, j, p.bidirectional, p.num_buckets, p.max_distance);
}

void attention(const Args& a) {
  const Dims z = dims_of(a, 3);
  const int64_t tq = z.tq, tk = z.tk, d = z.d;
  const float scale = static_cast<float>(a.attr<AttentionAttrs>().scale);
  const float *q = a.fin(0), *k = a.fin(1), *v = a.fin(2);
  const float* bias = bias_of(a, 3);
  float *out = a.fout(0), *lse = a.fout(1);
  parallel_for(z.bsz * z.h, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> s(static_cast<size_t>(tq * tk));
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / z.h, hh = bh % z.h, kvh = hh / z.group;
      const float* qh = q + bh * tq * d;
      const float* kb = k + (b * z.hkv + kvh) * tk * d;
      const float* vb = v + (b * z.hkv + kvh) * tk * d;
      const float* bh_bias = bias ? bias + hh * tq * tk : nullptr;
      for (int64_t i0 = 0; i0 < tq; i0 += kBlock) {
        const int64_t i1 = std::min(tq, i0 + kBlock), rows = i1 - i0, keys = z.block_end(i1);
        float* sb = s.data() + i0 * tk;
        if (keys == 0) {  // a chunk of later keys: nothing to attend to
          std::fill(out + (bh * tq + i0) * d, out + (bh * tq + i1) * d, 0.0f);
          std::fill(lse + bh * tq + i0, lse + bh * tq + i1,
                    -std::numeric_limits<float>::infinity());
          continue;
        }
        // S = scale * Q K^T + bias, P = softmax(S), O = P V; keys [0, keys) only.
        sgemm(false, true, rows, keys, d, qh + i0 * d, d, kb, d, sb, tk, 0.0f);
        scale_and_bias(z, s.data(), bh_bias, scale, i0, i1, keys);
        softmax_rows(z, s.data(), i0, i1, lse + bh * tq);
        sgemm(false, false, rows, d, keys, sb, tk, vb, d, out + (bh * tq + i0) * d, d, 0.0f);
      }
    }
  });
}

void attention_grad(const Args& a) {
  const Dims z = dims_of(a, 6);
  const int64_t tq = z.tq, tk = z.tk, d = z.d;
  const float scale = static_cast<float>(a.attr<AttentionAttrs>().scale);
  const float *q = a.fin(0), *k = a.fin(1), *v = a.fin(2), *out = a.fin(3), *lse = a.fin(4),
              *dout = a.fin(5);
  const float* bias = bias_of(a, 6);
  float *dq = a.fout(0), *dk = a.fout(1), *dv = a.fout(2);
  float* dbias = bias ? a.fout(3) : nullptr;
  // One task per (batch, kv head): the query heads of a group write the same dk/dv rows. With
  // a bias, whose gradient sums over the batch, one task per kv head walks every example.
  const int64_t tasks = bias ? z.hkv : z.bsz * z.hkv;
  parallel_for(tasks, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> p(static_cast<size_t>(tq * tk)), dp(p.size()), di(static_cast<size_t>(tq));
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t kvh = task % z.hkv, b0 = bias ? 0 : task / z.hkv;
      const int64_t b1 = bias ? z.bsz : b0 + 1;
      if (dbias) {
        float* first = dbias + kvh * z.group * tq * tk;
        std::fill(first, first + z.group * tq * tk, 0.0f);
      }
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t bk = b * z.hkv + kvh;
        const float* kb = k + bk * tk * d;
        const float* vb = v + bk * tk * d;
        float* dkb = dk + bk * tk * d;
        float* dvb = dv + bk * tk * d;
        std::fill(dkb, dkb + tk * d, 0.0f);
        std::fill(dvb, dvb + tk * d, 0.0f);
        for (int64_t g = 0; g < z.group; ++g) {
          const int64_t hh = kvh * z.group + g, row0 = (b * z.h + hh) * tq;
          const float *qh = q + row0 * d, *oh = out + row0 * d, *doh = dout + row0 * d;
          const float* lh = lse + row0;
          const float* hb = bias ? bias + hh * tq * tk : nullptr;
          float* dhb = dbias ? dbias + hh * tq * tk : nullptr;
          for (int64_t i0 = 0; i0 < tq; i0 += kBlock) {
            const int64_t i1 = std::min(tq, i0 + kBlock), rows = i1 - i0, keys = z.block_end(i1);
            float *pb = p.data() + i0 * tk, *dpb = dp.data() + i0 * tk;
            const float *qb = qh + i0 * d, *dob = doh + i0 * d;
            if (keys == 0) {  // a chunk of later keys: no gradient through it
              std::fill(dq + (row0 + i0) * d, dq + (row0 + i1) * d, 0.0f);
              continue;
            }
            // P = exp(scale * Q K^T + bias - lse) (0 where masked); D_i = dO_i . O_i.
            sgemm(false, true, rows, keys, d, qb, d, kb, d, pb, tk, 0.0f);
            scale_and_bias(z, p.data(), hb, scale, i0, i1, keys);
            for (int64_t i = i0; i < i1; ++i) {
              float* row = p.data() + i * tk;
              const float l = lh[i];
              const int64_t n = z.row_end(i);
#pragma omp simd
              for (int64_t j = 0; j < n; ++j) row[j] = exp_fast(row[j] - l);
              for (int64_t j = n; j < keys; ++j) row[j] = 0.0f;
              float s = 0;
              const float *dor = doh + i * d, *orow = oh + i * d;
#pragma omp simd reduction(+ : s)
              for (int64_t c = 0; c < d; ++c) s += dor[c] * orow[c];
              di[static_cast<size_t>(i)] = s;
            }
            // dV += P^T dO; dP = dO V^T; dS = P (dP - D) (dbias += dS); dQ = scale dS K;
            // dK += scale dS^T Q.
            sgemm(true, false, keys, d, rows, pb, tk, dob, d, dvb, d, 1.0f);
            sgemm(false, true, rows, keys, d, dob, d, vb, d, dpb, tk, 0.0f);
            for (int64_t i = i0; i < i1; ++i) {
              float *pr = p.data() + i * tk, *dpr = dp.data() + i * tk;
              const float dii = di[static_cast<size_t>(i)];
#pragma omp simd
              for (int64_t j = 0; j < keys; ++j) pr[j] = pr[j] * (dpr[j] - dii);
              if (dhb) {
                float* dbr = dhb + i * tk;
#pragma omp simd
                for (int64_t j = 0; j < keys; ++j) dbr[j] += pr[j];
              }
#pragma omp simd
              for (int64_t j = 0; j < keys; ++j) pr[j] *= scale;
            }
            sgemm(false, false, rows, d, keys, pb, tk, kb, d, dq + (row0 + i0) * d, d, 0.0f);
            sgemm(true, false, keys, d, rows, pb, tk, qb, d, dkb, d, 1.0f);
          }
        }
      }
    }
  });
}

// Two attentions of the same queries over disjoint keys as one (ops_nn.cc's attention_merge).
void attention_merge(const Args& a) {
  const Shape& so = a.in_shape(0);
  const int64_t rows = so[0] * so[1] * so[2], d = so[3];
  const float *oa = a.fin(0), *la = a.fin(1), *ob = a.fin(2), *lb = a.fin(3);
  float *o = a.fout(0), *l = a.fout(1);
  parallel_for(rows, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float m = std::max(la[r], lb[r]);
      float* orow = o + r * d;
      if (m == -std::numeric_limits<float>::infinity()) {
        std::fill(orow, orow + d, 0.0f);
        l[r] = m;
        continue;
      }
      const float wa = std::exp(la[r] - m), wb = std::exp(lb[r] - m), sum = wa + wb;
      const float ca = wa / sum, cb = wb / sum;
      const float *ar = oa + r * d, *br = ob + r * d;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) orow[c] = ca * ar[c] + cb * br[c];
      l[r] = m + std::log(sum);
    }
  });
}

// Registers this file's kernels (cpu_backend.cc builds the table once).
void register_attention_kernels(KernelTable& t) {
  t.add(OpKind::position_buckets, [](OpKind, const Args& a) { position_buckets(a); });
  t.add(OpKind::attention, [](OpKind, const Args& a) { attention(a); });
  t.add(OpKind::attention_grad, [](OpKind, const Args& a) { attention_grad(a); });
  t.add(OpKind::attention_merge, [](OpKind, const Args& a) { attention_merge(a); });
}

}  // namespace tessera::cpu

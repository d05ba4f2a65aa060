#include <cblas.h>

#include "backend/cpu/kernels.h"

namespace tessera::cpu {

// C[M,N] = op(A) op(B) through OpenBLAS; batched operands loop over the batch, a rank-2 right
// operand is shared by folding the left operand's batch into its rows.
void matmul(const Args& a) {
  const Shape &sa = a.in_shape(0), &sb = a.in_shape(1), &sc = a.out_shape(0);
  bool ta = a.attrs.transpose_a, tb = a.attrs.transpose_b;
  int64_t m = sc[-2], n = sc[-1];
  int64_t k = ta ? sa[-2] : sa[-1];
  int64_t lda = sa[-1], ldb = sb[-1];
  CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  const float *A = a.fin(0), *B = a.fin(1);
  float* C = a.fout(0);
  if (sb.rank() == 2) {
    int64_t rows = sc.numel() / n;  // batch folded into M (transpose_a excluded by inference)
    if (sa.rank() == 2) rows = m;
    cblas_sgemm(CblasRowMajor, opa, opb, static_cast<int>(rows), static_cast<int>(n),
                static_cast<int>(k), 1.0f, A, static_cast<int>(lda), B, static_cast<int>(ldb), 0.0f,
                C, static_cast<int>(n));
    return;
  }
  int64_t batch = sc.numel() / (m * n);
  int64_t stride_a = sa[-1] * sa[-2], stride_b = sb[-1] * sb[-2];
  for (int64_t i = 0; i < batch; ++i)
    cblas_sgemm(CblasRowMajor, opa, opb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, A + i * stride_a, static_cast<int>(lda),
                B + i * stride_b, static_cast<int>(ldb), 0.0f, C + i * m * n, static_cast<int>(n));
}

}  // namespace tessera::cpu

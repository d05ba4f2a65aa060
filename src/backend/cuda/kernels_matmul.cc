// matmul through cuBLASLt: f32, bf16 or f16 operands as stored, f32 accumulation (no TF32, so
// f32 results match the CPU backend's). Row-major C = op(A) op(B) is computed as the
// column-major C^T = op(B)^T op(A)^T, so the operands swap places and keep their transposes.
// Batched operands are a strided batch; a rank-2 right operand is shared by folding the left
// operand's batch into its rows, as on the CPU.
#include <cublasLt.h>

#include <cstdint>
#include <utility>

#include "backend/cuda/kernels.h"
#include "base/check.h"

namespace tessera::cuda {

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

void check_lt(cublasStatus_t s, const char* what) {
  TS_CHECK(s == CUBLAS_STATUS_SUCCESS)
      << "cuBLASLt " << what << " failed: " << cublasLtGetStatusName(s);
}

// Owns the cuBLASLt descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// A column-major rows x cols layout with leading dimension ld, `batch` of them `stride` apart.
cublasLtMatrixLayout_t layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                              int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check_lt(cublasLtMatrixLayoutCreate(&l, t, static_cast<uint64_t>(rows),
                                      static_cast<uint64_t>(cols), ld),
           "layout");
  if (batch > 1) {
    int32_t count = static_cast<int32_t>(batch);
    check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                              sizeof count),
             "batch count");
    check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                              &stride, sizeof stride),
             "batch stride");
  }
  return l;
}

void matmul(OpKind, const Args& a) {
  const Shape &sa = a.in_shape(0), &sb = a.in_shape(1), &sc = a.out_shape(0);
  const MatmulAttrs& attrs = a.attr<MatmulAttrs>();
  const bool ta = attrs.transpose_a, tb = attrs.transpose_b;
  int64_t m = sc[-2];
  // A batch-folding matmul is one GEMM whose k runs over a's rows, flattened.
  const int64_t n = sc[-1], k = attrs.fold_batch ? (sa[-1] > 0 ? sa.numel() / sa[-1] : 0)
                                : ta             ? sa[-2]
                                                 : sa[-1];
  const int64_t lda = sa[-1], ldb = sb[-1];
  if (sc.numel() == 0) return;
  if (k == 0) {  // an empty sum: zeros, as on the CPU
    TS_CUDA(cudaMemsetAsync(a.out[0], 0, static_cast<size_t>(a.out_types[0].bytes()), a.stream));
    return;
  }
  int64_t batch = sc.numel() / (m * n);
  if (attrs.fold_batch) {
    batch = 1;
  } else if (sb.rank() == 2) {  // fold the batch into the rows (transpose_a excluded by inference)
    if (sa.rank() > 2) m *= batch;
    batch = 1;
  }
  const cudaDataType_t tab = cuda_type(a.in_types[0].dtype), tc = cuda_type(a.out_types[0].dtype);
  TS_CHECK(a.in_types[0].dtype == a.in_types[1].dtype)
      << "matmul operands of different dtypes reach the CUDA backend";

  Descriptors d;
  check_lt(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
  // Lt's A is our B, Lt's B is our A (see the top of the file).
  const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b),
           "transa");
  check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a),
           "transb");
  d.a = layout(tab, tb ? k : n, tb ? n : k, ldb, batch, sb[-1] * sb[-2]);
  d.b = layout(tab, ta ? m : k, ta ? k : m, lda, batch, sa[-1] * sa[-2]);
  d.c = layout(tc, n, m, n, batch, m * n);

  check_lt(cublasLtMatmulPreferenceCreate(&d.pref), "preference");
  const size_t ws = a.ctx->workspace_bytes;
  check_lt(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &ws, sizeof ws),
           "workspace");
  // cuBLASLt assumes 256-byte aligned operands unless told otherwise; the memory plan aligns
  // buffers to 64 bytes, so each call states what its pointers have.
  auto alignment = [](const void* p) {
    uint32_t al = 256;
    while (al > 1 && reinterpret_cast<uintptr_t>(p) % al != 0) al /= 2;
    return al;
  };
  const uint32_t al_a = alignment(a.in[1]), al_b = alignment(a.in[0]), al_c = alignment(a.out[0]);
  for (auto [attr, al] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a},
                          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b},
                          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c},
                          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_c}})
    check_lt(cublasLtMatmulPreferenceSetAttribute(d.pref, attr, &al, sizeof al), "alignment");
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  auto lt = static_cast<cublasLtHandle_t>(a.ctx->lt);
  check_lt(
      cublasLtMatmulAlgoGetHeuristic(lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heuristic, &found),
      "heuristic");
  TS_CHECK(found > 0 && heuristic.state == CUBLAS_STATUS_SUCCESS)
      << "cuBLASLt has no algorithm for matmul " << sa.to_string() << " x " << sb.to_string();
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(cublasLtMatmul(lt, d.op, &alpha, a.in[1], d.a, a.in[0], d.b, &beta, a.out[0], d.c,
                          a.out[0], d.c, &heuristic.algo, a.ctx->workspace, ws, a.stream),
           "matmul");
}

}  // namespace

void register_matmul_kernels(KernelTable& t) {
  t.add(OpKind::matmul, matmul, /*low_precision=*/true);
}

}  // namespace tessera::cuda

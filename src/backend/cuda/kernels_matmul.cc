// matmul through cuBLASLt: f32, bf16 or f16 operands as stored, f32 accumulation (no TF32, so
// f32 results match the CPU backend's). Row-major C = op(A) op(B) is computed as the
// column-major C^T = op(B)^T op(A)^T, so the operands swap places and keep their transposes.
// Batched operands are a strided batch; a rank-2 right operand is shared by folding the left
// operand's batch into its rows, as on the CPU. The fused epilogues (ir/ops_fused.cc) use
// cuBLASLt's BIAS, GELU_AUX_BIAS, DGELU_BGRAD and BGRADB epilogues.
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

// What a call fuses into its product: one of cuBLASLt's epilogues, the bias (read, or the bias
// gradient written) and the auxiliary matrix (GELU's input, written or read), [M, N] with
// leading dimension N.
struct Epilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  const void* aux = nullptr;
};

// D = op(A) op(B) of inputs 0 and 1, then epilogue `e`, into d. False (nothing enqueued) where
// `e` is an epilogue and the product is a strided batch or cuBLASLt has no algorithm for it.
bool product(const Args& a, void* d_out, const Epilogue& e) {
  const Shape &sa = a.in_shape(0), &sb = a.in_shape(1), &sc = a.out_shape(0);
  const MatmulAttrs& attrs = a.attr<MatmulAttrs>();
  const bool ta = attrs.transpose_a, tb = attrs.transpose_b;
  const bool fused = e.kind != CUBLASLT_EPILOGUE_DEFAULT;
  int64_t m = sc[-2];
  // A batch-folding matmul is one GEMM whose k runs over a's rows, flattened.
  const int64_t n = sc[-1], k = attrs.fold_batch ? (sa[-1] > 0 ? sa.numel() / sa[-1] : 0)
                                : ta             ? sa[-2]
                                                 : sa[-1];
  const int64_t lda = sa[-1], ldb = sb[-1];
  // An empty product: nothing to do, but a fused bias gradient must still be written (the
  // second pass does it).
  if (sc.numel() == 0) return !fused;
  if (k == 0) {  // an empty sum: zeros, as on the CPU
    if (fused) return false;
    TS_CUDA(cudaMemsetAsync(d_out, 0, static_cast<size_t>(a.out_types[0].bytes()), a.stream));
    return true;
  }
  int64_t batch = sc.numel() / (m * n);
  if (attrs.fold_batch) {
    batch = 1;
  } else if (sb.rank() == 2) {  // fold the batch into the rows (transpose_a excluded by inference)
    if (sa.rank() > 2) m *= batch;
    batch = 1;
  }
  if (fused && batch != 1) return false;
  // The aux matrix's leading dimension must be a multiple of 8 (cublasLt.h,
  // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD) and its pointer aligned; which the heuristic may not
  // check before cublasLtMatmul fails.
  if (e.aux && (n % 8 != 0 || reinterpret_cast<uintptr_t>(e.aux) % 16 != 0)) return false;
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
  if (fused) {
    // In Lt's column-major view D is [N, M]: the bias runs along its rows (our columns) and
    // the bias gradient sums over its columns (our rows); the aux matrix is laid out as D.
    check_lt(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e.kind, sizeof e.kind),
        "epilogue");
    if (e.bias)
      check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.bias,
                                              sizeof e.bias),
               "bias pointer");
    if (e.aux) {
      const int64_t ld = n;
      check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                              &e.aux, sizeof e.aux),
               "aux pointer");
      check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                              sizeof ld),
               "aux ld");
    }
  }
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
  const uint32_t al_a = alignment(a.in[1]), al_b = alignment(a.in[0]), al_c = alignment(d_out);
  for (auto [attr, al] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a},
                          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b},
                          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c},
                          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_c}})
    check_lt(cublasLtMatmulPreferenceSetAttribute(d.pref, attr, &al, sizeof al), "alignment");
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  auto lt = static_cast<cublasLtHandle_t>(a.ctx->lt);
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heuristic, &found);
  const bool ok =
      hs == CUBLAS_STATUS_SUCCESS && found > 0 && heuristic.state == CUBLAS_STATUS_SUCCESS;
  if (fused && !ok) return false;
  check_lt(hs, "heuristic");
  TS_CHECK(ok) << "cuBLASLt has no algorithm for matmul " << sa.to_string() << " x "
               << sb.to_string();
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t ms =
      cublasLtMatmul(lt, d.op, &alpha, a.in[1], d.a, a.in[0], d.b, &beta, d_out, d.c, d_out, d.c,
                     &heuristic.algo, a.ctx->workspace, ws, a.stream);
  if (fused && (ms == CUBLAS_STATUS_NOT_SUPPORTED || ms == CUBLAS_STATUS_INVALID_VALUE))
    return false;  // refused before anything was enqueued: the second pass instead
  check_lt(ms, "matmul");
  return true;
}

void matmul(OpKind, const Args& a) { product(a, a.out[0], {}); }

// The fused epilogues (ir/ops_fused.cc): cuBLASLt's epilogue where it has one for the product,
// else the product and a second pass (kernels_epilogue.cu).
void matmul_bias(OpKind, const Args& a) {
  if (product(a, a.out[0], {CUBLASLT_EPILOGUE_BIAS, a.in[2], nullptr})) return;
  product(a, a.out[0], {});
  const Shape& s = a.out_shape(0);
  bias_epilogue(a.out_types[0].dtype, nullptr, a.out[0], a.in[2], s.numel(), s[-1], false,
                a.stream);
}

void matmul_bias_gelu(OpKind, const Args& a) {
  if (product(a, a.out[0], {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, a.in[2], a.out[1]})) return;
  product(a, a.out[1], {});
  const Shape& s = a.out_shape(0);
  bias_epilogue(a.out_types[0].dtype, a.out[0], a.out[1], a.in[2], s.numel(), s[-1], true,
                a.stream);
}

void matmul_dgelu_bgrad(OpKind, const Args& a) {
  if (product(a, a.out[0], {CUBLASLT_EPILOGUE_DGELU_BGRAD, a.out[1], a.in[2]})) return;
  product(a, a.out[0], {});
  const Shape& s = a.out_shape(0);
  dgelu_bias_grad_epilogue(a.out_types[0].dtype, a.out[0], a.in[2], a.out[1], s.numel(), s[-1],
                           a.stream);
}

// The bias gradient from Lt's B operand (our dy), summed over k (our rows).
void matmul_bgrad(OpKind, const Args& a) {
  if (product(a, a.out[0], {CUBLASLT_EPILOGUE_BGRADB, a.out[1], nullptr})) return;
  product(a, a.out[0], {});
  const Shape& s = a.in_shape(0);
  column_sums(a.in_types[0].dtype, a.in[0], a.out[1], s.numel(), s[-1], a.stream);
}

}  // namespace

void register_matmul_kernels(KernelTable& t) {
  t.add(OpKind::matmul, matmul, /*low_precision=*/true);
  t.add(OpKind::matmul_bias, matmul_bias, /*low_precision=*/true);
  t.add(OpKind::matmul_bias_gelu, matmul_bias_gelu, /*low_precision=*/true);
  t.add(OpKind::matmul_dgelu_bgrad, matmul_dgelu_bgrad, /*low_precision=*/true);
  t.add(OpKind::matmul_bgrad, matmul_bgrad, /*low_precision=*/true);
}

}  // namespace tessera::cuda

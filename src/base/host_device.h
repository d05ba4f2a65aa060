// TS_HOST_DEVICE marks an inline function that both the CPU kernels and the CUDA kernels call,
// so that an op's arithmetic is written once (ir/position_buckets.h, ir/top_k_row.h).
#pragma once

#ifdef __CUDACC__
#define TS_HOST_DEVICE __host__ __device__
#else
#define TS_HOST_DEVICE
#endif

// The launchers behind grouped_gemm (grouped_gemm.h), one per kernel family.
#pragma once

#include "kernels/cuda/grouped_gemm.h"

namespace moe::cuda {

// aligned: 16-byte vector loads are legal (see mma_supports).
void stream_grouped_gemm(bool gated, const GroupedGemmArgs& args, bool aligned,
                         cudaStream_t stream);
void mma_grouped_gemm(bool gated, const GroupedGemmArgs& args, cudaStream_t stream);
void wgmma_grouped_gemm(bool gated, const GroupedGemmArgs& args, cudaStream_t stream);
// kernel: kTma, kTmaEager, kTmaPair or kTmaDynamic.
void tma_grouped_gemm(GemmKernel kernel, bool gated, const GroupedGemmArgs& args,
                      cudaStream_t stream);

}  // namespace moe::cuda

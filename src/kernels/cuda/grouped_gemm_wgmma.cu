// The prefill-size grouped GEMM on Hopper's warpgroup MMA (wgmma, sm_90a). Each warpgroup of
// 128 threads computes 64 pairs x 128 weight rows with m64n128k16 instructions that read both
// operands from shared memory through matrix descriptors. Tiles are K-major with the 128-byte
// swizzle (16-byte chunk c of row r stored at chunk c ^ (r % 8)), which is the layout those
// descriptors name; a multi-stage cp.async pipeline fills them, A rows gathered by pair id as in
// the mma.sync kernel. gemm1's B tile is 64 gate rows then the 64 matching up rows, so a thread
// holds gate and up of the same element and SiLU-and-multiply happens in registers.
#include <cuda_bf16.h>

#include "kernels/cuda/bf16_math.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/grouped_gemm_launch.h"
#include "kernels/cuda/tile_rows.cuh"

// wgmma exists only in the sm_90a target; other targets compile an empty body (never launched:
// the host checks the device first).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOE_HAS_WGMMA 1
#endif

namespace moe::cuda {
namespace {

constexpr int kTileK = 64;             // one 128-byte swizzled row of bf16
constexpr int kRowBytes = kTileK * 2;  // 128
constexpr int kWarpGroupRows = 64;

// kWarpGroups x 64 pairs by kTileN weight rows per block, kStages shared-memory stages.
template <int kWarpGroups, int kTileN, int kStages>
struct WgmmaTile {
  static constexpr int kThreads = kWarpGroups * 128;
  static constexpr int kBM = kWarpGroups * kWarpGroupRows;
  static constexpr int kABytes = kBM * kRowBytes;     // per stage
  static constexpr int kBBytes = kTileN * kRowBytes;  // per stage
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr size_t kSharedBytes = size_t{kStages} * kStageBytes + 1024;  // + alignment
  static constexpr int kChunksA = kBM * 8 / kThreads;
  static constexpr int kChunksB = kTileN * 8 / kThreads;
  static constexpr int kAccumulators = kTileN / 2;  // f32 per thread of a 64 x kTileN tile
  static_assert(kStages >= 3, "one stage computing, one landing, one being filled");
};

// Offset of 16-byte chunk c of row r in a 128-byte-swizzled K-major tile.
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t descriptor(uint32_t address) {
  uint64_t d = (address & 0x3ffff) >> 4;
  d |= uint64_t{1} << 16;          // leading byte offset (unused with this swizzle)
  d |= uint64_t{1024 >> 4} << 32;  // stride byte offset
  d |= uint64_t{1} << 62;          // 128-byte swizzle
  return d;
}

#ifdef MOE_HAS_WGMMA
// D[64 x 128] += A[64 x 16] * B[128 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, accumulate, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(a), "l"(b), "r"(1));
}

// D[64 x 256] += A[64 x 16] * B[256 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "
      "%127}, "
      "%128, %129, accumulate, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(1));
}
#endif

template <int kWarpGroups, int kTileN, int kStages, bool kGated>
__global__ void __launch_bounds__(kWarpGroups * 128, 1) wgmma_kernel(GroupedGemmArgs a) {
#ifdef MOE_HAS_WGMMA
  using Tile = WgmmaTile<kWarpGroups, kTileN, kStages>;
  constexpr int kBM = Tile::kBM;
  extern __shared__ unsigned char shared_raw[];
  __shared__ int32_t pair_of_row[kBM];
  __shared__ int32_t input_row[kBM];
  // The swizzle and the descriptors assume 1024-byte aligned tiles.
  const uint32_t base = (shared_address(shared_raw) + 1023) & ~1023u;

  const int64_t block = blockIdx.x;
  if (block * kBM >= *a.num_pairs_post_padded) return;
  const int32_t expert = a.expert_ids[block];
  if (expert < 0 || expert >= a.num_local_experts) return;

  const int64_t K = a.k_dim, columns = a.out_columns;
  load_block_rows<kBM, Tile::kThreads>(a, block, pair_of_row, input_row);

  const auto* input = static_cast<const __nv_bfloat16*>(a.input);
  const auto* expert_weights =
      static_cast<const __nv_bfloat16*>(a.weights) + expert * a.weight_rows * K;
  constexpr int kColumnsPerBlock = kGated ? kTileN / 2 : kTileN;
  const int64_t first_column = static_cast<int64_t>(blockIdx.y) * kColumnsPerBlock;

  const __nv_bfloat16* b_source[Tile::kChunksB];
  bool b_valid[Tile::kChunksB];
#pragma unroll
  for (int i = 0; i < Tile::kChunksB; ++i) {
    const int j = (threadIdx.x + i * Tile::kThreads) / 8;
    const int64_t column = first_column + (kGated ? j % (kTileN / 2) : j);
    const int64_t row = (kGated && j >= kTileN / 2) ? columns + column : column;
    b_valid[i] = column < columns;
    b_source[i] = expert_weights + (b_valid[i] ? row : 0) * K;
  }

  auto load_stage = [&](int stage, int64_t k0) {
    const uint32_t a_stage = base + stage * Tile::kStageBytes;
    const uint32_t b_stage = a_stage + Tile::kABytes;
#pragma unroll
    for (int i = 0; i < Tile::kChunksA; ++i) {
      const int chunk = threadIdx.x + i * Tile::kThreads;
      const int r = chunk / 8, c = chunk % 8;
      const int64_t k = k0 + c * 8;
      const int32_t source = input_row[r];
      const bool valid = source >= 0 && k < K;
      copy16_async(a_stage + swizzled(r, c), valid ? input + source * K + k : input, valid);
    }
#pragma unroll
    for (int i = 0; i < Tile::kChunksB; ++i) {
      const int chunk = threadIdx.x + i * Tile::kThreads;
      const int j = chunk / 8, c = chunk % 8;
      const int64_t k = k0 + c * 8;
      const bool valid = b_valid[i] && k < K;
      copy16_async(b_stage + swizzled(j, c), valid ? b_source[i] + k : expert_weights, valid);
    }
  };

  const int warp_group = threadIdx.x / 128;
  float acc[Tile::kAccumulators];
#pragma unroll
  for (int i = 0; i < Tile::kAccumulators; ++i) acc[i] = 0.0f;

  // Loads run kStages - 2 tiles ahead and one wgmma group stays in flight: the stage refilled in
  // iteration kt was last read by group kt - 2, which every warpgroup has waited for before
  // reaching this iteration's barrier.
  constexpr int kAhead = kStages - 2;
  const int64_t k_tiles = (K + kTileK - 1) / kTileK;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < k_tiles) load_stage(s, s * kTileK);
    commit_copies();
  }
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    wait_copies<kAhead - 1>();
    // cp.async wrote through the generic proxy; wgmma reads through the async proxy.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int64_t next = kt + kAhead;
    if (next < k_tiles) load_stage(static_cast<int>(next % kStages), next * kTileK);
    commit_copies();

    const uint32_t a_stage = base + static_cast<int>(kt % kStages) * Tile::kStageBytes;
    const uint32_t a_tile = a_stage + warp_group * kWarpGroupRows * kRowBytes;
    const uint32_t b_tile = a_stage + Tile::kABytes;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
      // Within the swizzled 128-byte row, step k16 is 32 bytes further.
      if constexpr (kTileN == 256) {
        wgmma_m64n256k16(acc, descriptor(a_tile + kk * 32), descriptor(b_tile + kk * 32));
      } else {
        wgmma_m64n128k16(acc, descriptor(a_tile + kk * 32), descriptor(b_tile + kk * 32));
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  wait_copies<0>();

  // Accumulator i of a thread: row 16 * warp + lane / 4 (+ 8 for i % 4 >= 2), column
  // 8 * (i / 4) + 2 * (lane % 4) + i % 2, within this warpgroup's 64 x kTileN tile.
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  auto* out = static_cast<__nv_bfloat16*>(a.out);
  const bool paired_stores = columns % 2 == 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = warp_group * kWarpGroupRows + warp * 16 + lane / 4 + half * 8;
    const int32_t pair = pair_of_row[row];
    if (pair < 0) continue;
    const float scale = (!kGated && a.topk_weights != nullptr) ? a.topk_weights[pair] : 1.0f;
    constexpr int kOutChunks = kGated ? kTileN / 16 : kTileN / 8;
#pragma unroll
    for (int n = 0; n < kOutChunks; ++n) {
      const int64_t column = first_column + n * 8 + (lane % 4) * 2;
      float v[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = acc[n * 4 + half * 2 + e];
        if constexpr (kGated) {
          v[e] = silu(x) * acc[(n + kOutChunks) * 4 + half * 2 + e];
        } else {
          v[e] = x * scale;
        }
      }
      store_bf16_pair(out + pair * columns, column, columns, paired_stores, v[0], v[1]);
    }
  }
#endif
}

template <int kWarpGroups, int kTileN, int kStages, bool kGated>
void launch(const GroupedGemmArgs& args, cudaStream_t stream) {
  using Tile = WgmmaTile<kWarpGroups, kTileN, kStages>;
  auto* kernel = wgmma_kernel<kWarpGroups, kTileN, kStages, kGated>;
  static const bool attribute_set = [kernel] {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(Tile::kSharedBytes)),
          "cudaFuncSetAttribute(wgmma_kernel)");
    return true;
  }();
  (void)attribute_set;
  const int64_t columns_per_block = kGated ? kTileN / 2 : kTileN;
  const dim3 grid(
      static_cast<unsigned>(args.max_blocks),
      static_cast<unsigned>((args.out_columns + columns_per_block - 1) / columns_per_block));
  kernel<<<grid, Tile::kThreads, Tile::kSharedBytes, stream>>>(args);
}

}  // namespace

bool wgmma_available() {
  static const bool available = [] {
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    return major == 9 && minor == 0;
  }();
  return available;
}

void wgmma_grouped_gemm(bool gated, const GroupedGemmArgs& args, cudaStream_t stream) {
  // 128 rows: wide tiles (half the A-tile traffic per flop); 64 rows, for experts with fewer
  // pairs: narrower tiles and two blocks per multiprocessor, for more blocks in flight.
  if (args.block_m == 128) {
    gated ? launch<2, 256, 4, true>(args, stream) : launch<2, 256, 4, false>(args, stream);
  } else {
    gated ? launch<1, 128, 4, true>(args, stream) : launch<1, 128, 4, false>(args, stream);
  }
  check_launch("grouped_gemm (wgmma)");
}

}  // namespace moe::cuda

// Expert-parallel dispatch and combine over NVLink with NCCL's device API (DESIGN.md §5,
// include/mxmoe/ep.h, docs/notes/ep.md).
//
// dispatch: for every token t < max_tokens of this rank (t >= tokens: ids all -1) and every rank d:
//     window_d.record(self, t).ids    = topk_ids[t, :]                       (always, 16-byte stores)
//     window_d.record(self, t).data   = x_data[t, :]   E4M3 [H]              (if d owns one of the
//     window_d.record(self, t).scales = x_scales[t, :] E8M0 [H/32] + zero pad  token's experts)
//   (dispatch_bf16: the BF16 row x[t, :] into window_d.bf16_row(self, t) and, if given, w[t, :]
//   into window_d.weights(self, t), both only for the owners)
//   then, on the receiving side, local_ids[s·max_tokens + t, j] = id − rank·E/R for the ids this
//   rank owns, else -1; home_row[t, j] = t·k + j for a valid id, else -1.
// combine: for every (s, t, j) with local_ids >= 0 and row = row_of[s·max_tokens + t, j] >= 0:
//     window_s.combine[t·k + j, :] = y[row, :]   BF16 [H]
//   (the final Σ_j w·Y runs afterwards as moe_combine on the local combine region.)
// fused combine: combine_targets gives each padded row r its slot's address (the inverse of
//   row_of), an expert GEMM writes the rows there (row epilogue), combine_barrier syncs as combine.
//
// Work split: CTA b owns tokens t ≡ b (mod gridDim.x) on every rank, one warp per token at a time.
// Because the split is the same on every rank, CTA b's LSA barrier (index b) is enough: after it,
// CTA b of the receiver sees everything CTA b of every sender stored, which is exactly the set of
// records it unpacks. Each kernel syncs twice: on entry (the receiver has finished with the
// buffer: it reached this kernel in its stream order) and after the stores.
//
// Bytes per token and destination: H + roundup(H/32, 16) + roundup(4k, 16) (dispatch; 7168-wide
// rows: 7408 bytes, 52% of the BF16 row), 2H per (t, j) back (combine, BF16). Stores are 16 bytes
// per lane, a warp writes 512 contiguous bytes per instruction.
// Covered by tests/ep/ep_test.cu (bitwise against the single-GPU computation) — run with
// scripts/ep_launch.sh.
#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "host/check.h"
#include "kernels/ep/combine_slot.h"
#include "kernels/ep/ep_launch.h"
#include "kernels/ep/lsa_barrier_timed.cuh"
#include "mxmoe/ep.h"

namespace mxmoe::ep {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xFFFFFFFFu;
static_assert(mxmoe::kMaxEpTopK <= 32, "one lane per slot j");
static_assert(mxmoe::kMaxEpRanks <= 64, "destination sets are 64-bit masks");

using detail::EpKernelArgs;

// Address of byte `offset` of peer's window. kSingle (world == 1): the window is local memory.
template <bool kSingle>
__device__ __forceinline__ char* win_ptr(const EpKernelArgs& a, int64_t offset, int peer) {
  if constexpr (kSingle) return a.local_window + offset;
  else return static_cast<char*>(ncclGetLsaPointer(a.win, size_t(offset), peer));
}

// The entry/exit barriers across ranks. A single rank has no peer: stream order already separates
// this kernel from the previous one, so the barrier is a no-op.
template <bool kSingle>
struct RankBarrier;
template <>
struct RankBarrier<true> {
  __device__ RankBarrier(const ncclDevComm&) {}
  __device__ void sync(const EpKernelArgs&, int) {}
};
template <>
struct RankBarrier<false> {
  ncclLsaBarrierSession<ncclCoopCta> bar;
  __device__ RankBarrier(const ncclDevComm& dev)
      : bar(ncclCoopCta(), dev, ncclTeamLsa(dev), dev.lsaBarrier, blockIdx.x) {}
  __device__ void sync(const EpKernelArgs& a, int err) { lsa_sync_timed(bar, a.timeout_ns, a.error_flag, err); }
};

__device__ __forceinline__ void st16(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

// Copies nvec 16-byte vectors: store(c, src[c]) for c = lane, lane + 32, ... Each lane issues the
// loads of kCopyBatch vectors before it stores any, so a warp keeps 32·kCopyBatch·16 B in flight.
// (Before run 33 a lane loaded and stored one vector at a time; the compiler overlapped at most
// two, and dispatch/combine ran at ~240 GB/s, 61% of the P2P copy: local-read latency, not NVLink.)
constexpr int kCopyBatch = 8;
template <class Store>
__device__ __forceinline__ void copy_vectors(const uint4* src, int nvec, int lane, Store&& store) {
  for (int c0 = lane; c0 < nvec; c0 += 32 * kCopyBatch) {
    uint4 v[kCopyBatch];
#pragma unroll
    for (int i = 0; i < kCopyBatch; ++i)
      if (c0 + 32 * i < nvec) v[i] = __ldg(src + c0 + 32 * i);
#pragma unroll
    for (int i = 0; i < kCopyBatch; ++i)
      if (c0 + 32 * i < nvec) store(c0 + 32 * i, v[i]);
  }
}

// A row of `bytes` (multiple of 16, 16-byte aligned source) read once and stored at byte `offset`
// of the window of every rank in dest_mask.
template <bool kSingle>
__device__ __forceinline__ void copy_row(const EpKernelArgs& a, const uint8_t* src, int bytes, int64_t offset,
                                         uint64_t dest_mask, int lane) {
  copy_vectors(reinterpret_cast<const uint4*>(src), bytes / 16, lane, [&](int c, const uint4& v) {
    for (uint64_t m = dest_mask; m; m &= m - 1) st16(win_ptr<kSingle>(a, offset + 16 * c, __ffsll(int64_t(m)) - 1), v);
  });
}

// Lane j (< k) holds id j of token t (-1 past `tokens` or for j >= k).
__device__ __forceinline__ int load_slot_id(const int32_t* ids, int t, const EpKernelArgs& a, int lane) {
  return (t < a.tokens && lane < a.top_k) ? ids[int64_t(t) * a.top_k + lane] : -1;
}

// Payloads of a dispatch record (s, t): what goes to the ranks in dest_mask besides the ids.
// MX (dispatch): H bytes of E4M3 data and H/32 scale bytes (zero-padded to scale_bytes) into the
// record itself.
struct MxPayload {
  const uint8_t* data;
  const uint8_t* scales;
  template <bool kSingle>
  __device__ void send(const EpKernelArgs& a, int t, uint64_t dest_mask, int lane) const {
    const int64_t rec = a.record_bytes * (int64_t(a.rank) * a.max_tokens + t);  // record (self, t)
    // scales: H/32 bytes, zero-padded to scale_bytes (16-byte stores).
    const int n_scale = a.hidden / 32;
    for (int c = lane; c < a.scale_bytes / 16; c += 32) {
      uint32_t w4[4] = {0, 0, 0, 0};
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int b = 16 * c + i;
        const uint32_t byte = b < n_scale ? scales[int64_t(t) * n_scale + b] : 0u;
        w4[i / 4] |= byte << (8 * (i % 4));
      }
      const uint4 v = make_uint4(w4[0], w4[1], w4[2], w4[3]);
      for (uint64_t m = dest_mask; m; m &= m - 1)
        st16(win_ptr<kSingle>(a, rec + a.hidden + 16 * c, __ffsll(int64_t(m)) - 1), v);
    }
    copy_row<kSingle>(a, data + int64_t(t) * a.hidden, a.hidden, rec, dest_mask, lane);
  }
};

// BF16 (dispatch_bf16): the 2H-byte row into row (self, t) of the BF16 region, and the token's k
// routing weights (if given) into the weight region.
struct Bf16Payload {
  const uint8_t* rows;   // BF16 [tokens, H] as bytes
  const float* weights;  // FP32 [tokens, k] or null
  template <bool kSingle>
  __device__ void send(const EpKernelArgs& a, int t, uint64_t dest_mask, int lane) const {
    const int64_t u = int64_t(a.rank) * a.max_tokens + t;
    const int row_bytes = 2 * a.hidden;
    copy_row<kSingle>(a, rows + int64_t(t) * row_bytes, row_bytes, a.bf16_offset + u * row_bytes, dest_mask, lane);
    if (weights != nullptr && lane < a.top_k) {
      const float w = weights[int64_t(t) * a.top_k + lane];
      for (uint64_t m = dest_mask; m; m &= m - 1)
        *reinterpret_cast<float*>(win_ptr<kSingle>(a, a.weights_offset + (u * a.top_k + lane) * 4,
                                                   __ffsll(int64_t(m)) - 1)) = w;
    }
  }
};

// One warp sends token t of this rank to every rank (ids always; the payload to the owners).
template <bool kSingle, class Payload>
__device__ void dispatch_token(const EpKernelArgs& a, int t, const Payload& payload, const int32_t* topk_ids,
                               int lane) {
  const int id = load_slot_id(topk_ids, t, a, lane);
  const bool valid = id >= 0 && id < a.num_experts;
  const int owner = valid ? id / a.local_experts : -1;
  const uint32_t lo = __reduce_or_sync(kFull, (owner >= 0 && owner < 32) ? 1u << owner : 0u);
  const uint32_t hi = __reduce_or_sync(kFull, owner >= 32 ? 1u << (owner - 32) : 0u);
  const uint64_t dest_mask = (uint64_t(hi) << 32) | lo;
  if (lane < a.top_k) a.home_row[int64_t(t) * a.top_k + lane] = valid ? t * a.top_k + lane : -1;

  const int64_t rec = a.record_bytes * (int64_t(a.rank) * a.max_tokens + t);  // record (self, t)
  const int64_t ids_off = rec + a.hidden + a.scale_bytes;
  // ids: 16-byte words of 4 slots; raw ids (the receiver re-checks the range), -1 past k.
  const int n_id_vec = a.ids_bytes / 16;
  uint4 idv = make_uint4(0, 0, 0, 0);
  for (int w = 0; w < n_id_vec; ++w) {  // every lane takes part in the shuffles
    uint32_t q[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = 4 * w + i;
      const int v = __shfl_sync(kFull, id, j & 31);
      q[i] = uint32_t(j < a.top_k ? v : -1);
    }
    if (lane == w) idv = make_uint4(q[0], q[1], q[2], q[3]);
  }
  for (int d = 0; d < a.world; ++d)
    if (lane < n_id_vec) st16(win_ptr<kSingle>(a, ids_off + 16 * lane, d), idv);
  if (dest_mask == 0) return;
  payload.template send<kSingle>(a, t, dest_mask, lane);
}

template <bool kSingle, class Payload>
__global__ void __launch_bounds__(kThreads, 1) ep_dispatch_kernel(const __grid_constant__ ncclDevComm dev,
                                                               const EpKernelArgs a, const Payload payload,
                                                               const int32_t* topk_ids) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  RankBarrier<kSingle> bar(dev);
  // Entry: every peer has reached this kernel, so it no longer reads its dispatch regions.
  bar.sync(a, detail::kEpErrDispatchEntry);

  for (int t = blockIdx.x + gridDim.x * warp; t < a.max_tokens; t += gridDim.x * kWarps)
    dispatch_token<kSingle>(a, t, payload, topk_ids, lane);

  // Exit: CTA b of every peer has stored its records (tokens ≡ b) into our window.
  bar.sync(a, detail::kEpErrDispatchExit);

  // Unpack the ids of the records CTA b of every source just wrote.
  const int64_t ids_in_rec = a.hidden + a.scale_bytes;
  for (int t = blockIdx.x + gridDim.x * warp; t < a.max_tokens; t += gridDim.x * kWarps) {
    for (int s = 0; s < a.world; ++s) {
      const int64_t u = int64_t(s) * a.max_tokens + t;
      if (lane < a.top_k) {
        const int32_t* rid = reinterpret_cast<const int32_t*>(
            win_ptr<kSingle>(a, a.record_bytes * u + ids_in_rec, a.rank));
        const int id = rid[lane];
        const bool mine = id >= 0 && id < a.num_experts && id / a.local_experts == a.rank;
        a.local_ids[u * a.top_k + lane] = mine ? id - a.rank * a.local_experts : -1;
      }
    }
  }
}

template <bool kSingle>
__global__ void __launch_bounds__(kThreads) ep_combine_kernel(const __grid_constant__ ncclDevComm dev,
                                                              const EpKernelArgs a, const uint4* y, int64_t y_rows,
                                                              const int32_t* row_of) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  RankBarrier<kSingle> bar(dev);
  // Entry: every token owner has reached this kernel, so its previous combine sum is done.
  bar.sync(a, detail::kEpErrCombineEntry);

  const int vec_per_row = a.hidden * 2 / 16;  // BF16 row in 16-byte vectors
  for (int t = blockIdx.x + gridDim.x * warp; t < a.max_tokens; t += gridDim.x * kWarps) {
    for (int s = 0; s < a.world; ++s) {
      const int64_t u = int64_t(s) * a.max_tokens + t;
      int row = -1;
      if (lane < a.top_k && a.local_ids[u * a.top_k + lane] >= 0) row = row_of[u * a.top_k + lane];
      for (int j = 0; j < a.top_k; ++j) {
        const int r = __shfl_sync(kFull, row, j);
        if (r < 0 || r >= y_rows) continue;
        const uint4* src = y + int64_t(r) * vec_per_row;
        char* dst = win_ptr<kSingle>(a, a.combine_offset + (int64_t(t) * a.top_k + j) * a.hidden * 2, s);
        copy_vectors(src, vec_per_row, lane, [&](int c, const uint4& v) { st16(dst + 16 * c, v); });
      }
    }
  }
  // Exit: our slots are in the owners' windows; theirs are in ours.
  bar.sync(a, detail::kEpErrCombineExit);
}

// ---- fused combine (EpComm::combine_targets / combine_commit; docs/notes/ep.md, "Fused combine") ----
//
// The combine kernel above copies row row_of[(s, t, j)] of y to slot t·k + j of rank s's combine
// region, for every (s, t, j) with local_ids >= 0 and 0 <= row < y_rows. In the fused combine the
// expert GEMM writes each output row there itself (m_grouped_mxfp8_gemm_nt_to_rows), so it needs,
// per padded row r, that destination: the inverse of row_of (combine_slot_of_row, combine_slot.h:
// row_of is injective on valid slots, every (record, slot) has its own padded row). One thread per
// row; dst = win_ptr(s, slot) exactly as the combine kernel forms it, null for a pad row, a row at
// or beyond *rows_used, or a row no valid slot names. So the rows written and their places are the
// combine kernel's.
template <bool kSingle>
__global__ void __launch_bounds__(256) ep_combine_targets_kernel(const EpKernelArgs a, const int32_t* row_index,
                                                                 const int32_t* row_of, int64_t rows,
                                                                 const int32_t* rows_used, void** targets) {
  const int64_t limit = rows_used ? min(rows, int64_t(*rows_used)) : rows;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    const CombineSlot c =
        combine_slot_of_row(r, limit, row_index, row_of, a.local_ids, a.top_k, a.max_tokens, a.world);
    targets[r] = c.rank < 0 ? nullptr : win_ptr<kSingle>(a, a.combine_offset + c.slot * a.hidden * 2, c.rank);
  }
}

// The combine kernel's two barriers without its copies: the rows are already in the owners'
// windows (or on their way), written by the previous kernel of this stream (the row-epilogue GEMM).
// Ordering, the argument of the combine kernel with one more link:
//  - Free to write (WAR): the GEMM writes into rank s's combine region only after this pass's
//    dispatch, whose entry barrier CTA b of rank s reached after its previous reads of that region
//    (the last combine sum / un-permute, earlier in its stream; no PDL anywhere in the EP step), and
//    whose exit barrier every CTA of ours waited on before the GEMM was launched (stream order).
//    The GEMM's store warps issue fence.proxy.async.global before their first bulk copy, so that
//    order also holds for the async proxy that performs the copies.
//  - Published (RAW): each issuing thread ends with cp.async.bulk.wait_group 0 (its copies'
//    writes are complete and visible to it), fence.proxy.async.global (ordered before its later
//    generic accesses) and fence.sc.sys, then the GEMM grid completes; this kernel starts after
//    that (plain launch, stream order), and each CTA's arrive is __syncthreads + st.release.sys of
//    the epoch into every peer's inbox (NCCL's arrive), which is ordered after the GEMM's writes.
//    A peer's CTA b that acquires that epoch (lsa_wait_timed, ld.acquire.sys) therefore sees
//    every row this rank wrote to it — the whole GEMM, not only "CTA b's rows", because the
//    release comes after the whole grid — and so does every later kernel of the peer's stream.
//  - Two syncs (entry, exit) as in ep_combine_kernel, so the barrier epochs advance alike on both
//    paths: a rank on the copy path (MXMOE_EP_FUSED_COMBINE=0) pairs with a rank on this one. Its
//    copies into our region start after its entry sync, which needs our first arrival (after our
//    GEMM; our region has been free since our dispatch), and our exit wait needs its exit arrival
//    (after its copies). Our rows reach it before our first arrival, before its exit wait returns.
// (world == 1 launches nothing: no peers, stream order suffices.)
__global__ void __launch_bounds__(32) ep_combine_barrier_kernel(const __grid_constant__ ncclDevComm dev,
                                                                const EpKernelArgs a) {
  RankBarrier<false> bar(dev);
  bar.sync(a, detail::kEpErrCombineEntry);
  bar.sync(a, detail::kEpErrCombineExit);
}

// The address of byte 0 of `peer`'s window as this GPU maps it (EpComm::peer_window).
__global__ void ep_peer_window_kernel(const EpKernelArgs a, int peer, void** out) {
  *out = a.world == 1 ? static_cast<void*>(a.local_window) : ncclGetLsaPointer(a.win, 0, peer);
}

// One warp per output row: data (16-byte vectors) and scales (bytes) of record row_index[r].
__global__ void __launch_bounds__(256) ep_gather_recv_mx_kernel(const uint8_t* records, int64_t record_bytes,
                                                                int64_t num_records, int hidden,
                                                                const int32_t* row_index, int64_t out_rows,
                                                                const int32_t* rows_used, uint8_t* data,
                                                                uint8_t* scales) {
  const int lane = threadIdx.x % 32;
  const int64_t limit = rows_used ? min(out_rows, int64_t(*rows_used)) : out_rows;
  const int n_scale = hidden / 32;
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; r < limit;
       r += int64_t(gridDim.x) * blockDim.x / 32) {
    const int64_t u = row_index[r];
    const bool live = u >= 0 && u < num_records;
    const uint8_t* rec = records + (live ? u : 0) * record_bytes;
    uint4* dst = reinterpret_cast<uint4*>(data + r * hidden);
    for (int c = lane; c < hidden / 16; c += 32)
      dst[c] = live ? *reinterpret_cast<const uint4*>(rec + 16 * c) : make_uint4(0, 0, 0, 0);
    for (int c = lane; c < n_scale; c += 32) scales[r * n_scale + c] = live ? rec[hidden + c] : uint8_t(0);
  }
}

}  // namespace mxmoe::ep

namespace mxmoe::detail {

void launch_ep_gather_recv_mx(const uint8_t* records, int64_t record_bytes, int64_t num_records, int hidden,
                              const int32_t* row_index, int64_t out_rows, const int32_t* rows_used, uint8_t* data,
                              uint8_t* scales, cudaStream_t stream) {
  if (out_rows == 0) return;
  const int64_t blocks = std::min<int64_t>((out_rows + 7) / 8, 132 * 16);
  ep::ep_gather_recv_mx_kernel<<<int(blocks), 256, 0, stream>>>(records, record_bytes, num_records, hidden, row_index,
                                                                out_rows, rows_used, data, scales);
  MXMOE_CHECK_LAUNCH("EpComm::gather_recv_mx");
}

namespace {
template <class Payload>
void launch_dispatch(const ncclDevComm& dev, const EpKernelArgs& a, int num_ctas, const Payload& p,
                     const int32_t* topk_ids, cudaStream_t stream, const char* fn) {
  if (a.world == 1) ep::ep_dispatch_kernel<true><<<num_ctas, ep::kThreads, 0, stream>>>(dev, a, p, topk_ids);
  else ep::ep_dispatch_kernel<false><<<num_ctas, ep::kThreads, 0, stream>>>(dev, a, p, topk_ids);
  MXMOE_CHECK_LAUNCH(fn);
}
}  // namespace

void launch_ep_dispatch(const ncclDevComm& dev, const EpKernelArgs& a, int num_ctas, const uint8_t* x_data,
                        const uint8_t* x_scales, const int32_t* topk_ids, cudaStream_t stream) {
  launch_dispatch(dev, a, num_ctas, ep::MxPayload{x_data, x_scales}, topk_ids, stream, "EpComm::dispatch");
}

void launch_ep_dispatch_bf16(const ncclDevComm& dev, const EpKernelArgs& a, int num_ctas, const void* x,
                             const float* weights, const int32_t* topk_ids, cudaStream_t stream) {
  launch_dispatch(dev, a, num_ctas, ep::Bf16Payload{static_cast<const uint8_t*>(x), weights}, topk_ids, stream,
                  "EpComm::dispatch_bf16");
}

void launch_ep_combine(const ncclDevComm& dev, const EpKernelArgs& a, int num_ctas, const void* y, int64_t y_rows,
                       const int32_t* row_of, cudaStream_t stream) {
  const auto* yv = static_cast<const uint4*>(y);
  if (a.world == 1) ep::ep_combine_kernel<true><<<num_ctas, ep::kThreads, 0, stream>>>(dev, a, yv, y_rows, row_of);
  else ep::ep_combine_kernel<false><<<num_ctas, ep::kThreads, 0, stream>>>(dev, a, yv, y_rows, row_of);
  MXMOE_CHECK_LAUNCH("EpComm::combine");
}

void launch_ep_combine_targets(const EpKernelArgs& a, const int32_t* row_index, const int32_t* row_of, int64_t rows,
                               const int32_t* rows_used, void** targets, cudaStream_t stream) {
  if (rows == 0) return;
  const int blocks = int(std::min<int64_t>((rows + 255) / 256, 132 * 8));
  if (a.world == 1)
    ep::ep_combine_targets_kernel<true><<<blocks, 256, 0, stream>>>(a, row_index, row_of, rows, rows_used, targets);
  else
    ep::ep_combine_targets_kernel<false><<<blocks, 256, 0, stream>>>(a, row_index, row_of, rows, rows_used, targets);
  MXMOE_CHECK_LAUNCH("EpComm::combine_targets");
}

void launch_ep_peer_window(const EpKernelArgs& a, int peer, void** out, cudaStream_t stream) {
  ep::ep_peer_window_kernel<<<1, 1, 0, stream>>>(a, peer, out);
  MXMOE_CHECK_LAUNCH("EpComm::peer_window");
}

void launch_ep_combine_barrier(const ncclDevComm& dev, const EpKernelArgs& a, int num_ctas, cudaStream_t stream) {
  if (a.world == 1) return;  // no peers: stream order is the only ordering needed
  ep::ep_combine_barrier_kernel<<<num_ctas, 32, 0, stream>>>(dev, a);
  MXMOE_CHECK_LAUNCH("EpComm::combine_commit");
}

}  // namespace mxmoe::detail

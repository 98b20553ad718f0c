// Launchers of the EP dispatch/combine kernels (src/kernels/ep/ep_dispatch_combine_sm90.cu), called
// by EpComm (src/host/ep_comm.cpp). Internal: arguments are checked by EpComm before these run.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>
#include <nccl.h>

struct ncclDevComm;

namespace mxmoe::detail {

// Bits of the device error flag (one int in device memory, OR-ed by the kernels).
enum EpErrorBits : int {
  kEpErrDispatchEntry = 1,  // dispatch: a peer did not reach the entry barrier in time
  kEpErrDispatchExit = 2,   // dispatch: a peer did not finish its stores in time
  kEpErrCombineEntry = 4,
  kEpErrCombineExit = 8,
};

struct EpKernelArgs {
  ncclWindow_t win = nullptr;    // the symmetric window (device handle from ncclCommWindowRegister)
  char* local_window = nullptr;  // world == 1: the window is plain device memory (NCCL gives a 1-rank
                                 // communicator no symmetric memory), and there are no peers to wait for
  int rank = 0, world = 1;       // world rank == LSA rank (checked at construction)
  int hidden = 0, top_k = 0, num_experts = 0, local_experts = 0;
  int max_tokens = 0, tokens = 0;
  int64_t record_bytes = 0;      // dispatch record: [H data][scale_bytes][ids_bytes]
  int scale_bytes = 0, ids_bytes = 0;
  int64_t combine_offset = 0;    // byte offset of the combine region in the window
  int64_t bf16_offset = 0;       // BF16 row region [R · max_tokens, H] (cfg.bf16_rows)
  int64_t weights_offset = 0;    // routing-weight region [R · max_tokens, k] FP32 (cfg.bf16_rows)
  uint64_t timeout_ns = 0;
  int* error_flag = nullptr;     // device int, EpErrorBits
  int32_t* home_row = nullptr;   // [max_tokens, k]: t·k + j for a valid id, else -1 (dispatch writes)
  int32_t* local_ids = nullptr;  // [R · max_tokens, k] (dispatch writes, combine reads)
};

// grid = num_ctas (= the device communicator's lsaBarrierCount), every rank the same. With
// a.world == 1, `dev` is not used (a.local_window is the window, no barriers).
void launch_ep_dispatch(const ncclDevComm& dev, const EpKernelArgs& a, int num_ctas, const uint8_t* x_data,
                        const uint8_t* x_scales, const int32_t* topk_ids, cudaStream_t stream);
// The BF16 form: rows x [tokens, H] (and weights [tokens, k] if non-null) instead of MX data + scales.
void launch_ep_dispatch_bf16(const ncclDevComm& dev, const EpKernelArgs& a, int num_ctas, const void* x,
                             const float* weights, const int32_t* topk_ids, cudaStream_t stream);
void launch_ep_combine(const ncclDevComm& dev, const EpKernelArgs& a, int num_ctas, const void* y, int64_t y_rows,
                       const int32_t* row_of, cudaStream_t stream);

// out (device) = the address of byte 0 of `peer`'s window as this GPU maps it.
void launch_ep_peer_window(const EpKernelArgs& a, int peer, void** out, cudaStream_t stream);

// Fused combine: targets[r] (r < rows) = the address of padded row r's combine slot (null: not
// sent); then, after the rows are written, the combine kernel's barriers alone (world == 1: none).
void launch_ep_combine_targets(const EpKernelArgs& a, const int32_t* row_index, const int32_t* row_of, int64_t rows,
                               const int32_t* rows_used, void** targets, cudaStream_t stream);
void launch_ep_combine_barrier(const ncclDevComm& dev, const EpKernelArgs& a, int num_ctas, cudaStream_t stream);

// Local: records of the window → padded MX rows (row_index < 0 or >= num_records: zero row).
void launch_ep_gather_recv_mx(const uint8_t* records, int64_t record_bytes, int64_t num_records, int hidden,
                              const int32_t* row_index, int64_t out_rows, const int32_t* rows_used, uint8_t* data,
                              uint8_t* scales, cudaStream_t stream);

}  // namespace mxmoe::detail

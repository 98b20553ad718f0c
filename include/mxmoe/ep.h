// Expert parallelism across the GPUs of one node (DESIGN.md §5; design notes: docs/notes/ep.md).
//
// Experts are sharded by rank: rank r owns experts [r·E/R, (r+1)·E/R). Every rank holds its own
// tokens x [T, H] (T <= max_tokens, may differ across ranks) and their routing (ids, weights
// [T, k]). One step is
//
//   quantize_mxfp8(x) → EpComm::dispatch → (per local expert computation on the received rows)
//                     → EpComm::combine → out [T, H] = Σ_j w[t, j] · Y(t, j)   (fixed j order)
//
// Transport: NCCL's device API only (a symmetric window registered with NCCL_WIN_COLL_SYMMETRIC,
// a device communicator, LSA pointers = plain 16-byte stores into the peer's window over NVLink,
// ncclLsaBarrierSession for ordering). NVLink multicast (NVLS) is never used: the constructor sets
// NCCL_NVLS_ENABLE=0 when it is unset and refuses any other value.
//
// Window (identical offsets on every rank; sizes from the config alone, nothing read back):
//   dispatch region: R · max_tokens records, record (s, t) = token t of source rank s:
//       [H bytes E4M3 data][roundup(H/32, 16) bytes E8M0 scales][roundup(4k, 16) bytes int32 ids]
//     The ids part is written to every rank for every t < max_tokens (-1 past the sender's T);
//     data + scales only to the ranks that own at least one of the token's k experts (a token
//     routed to two experts of one rank is sent once). Worst case: every token of every rank
//     routed to this rank = all R · max_tokens records.
//   combine region: max_tokens · k rows of H BF16; row t·k + j is written by the owner of the
//     expert of (t, j), exactly once; the token's rank then sums them in j order (moe_combine).
//   with cfg.bf16_rows only (dispatch_bf16, what EpMoeLayer uses):
//   BF16 row region: R · max_tokens rows of H BF16, row s · max_tokens + t = token t of source s
//     (written by the source for the ranks that own one of its experts, as the MX data);
//   weight region: R · max_tokens · k FP32, the routing weights of those tokens (same writers).
//
// Determinism: every byte has exactly one writer, no atomics, the final sum is the single-GPU
// layer's moe_combine on the same values, so outputs are bitwise equal to the single-GPU result.
//
// Barriers: each dispatch/combine kernel runs cfg.num_ctas CTAs; CTA b syncs with CTA b of every
// peer (LSA barrier index b) once on entry (the peer has finished reading the buffer it is about
// to receive into: stream order on the peer) and once after its stores (release/acquire at
// system scope). Waits time out after cfg.timeout_s: the kernel then finishes, sets an error flag,
// and EpComm::check() throws. After a timeout the communicator is unusable: destroy it.
//
// No host synchronisation inside dispatch/combine; both are capturable in a CUDA graph (as long
// as every rank replays the same sequence). All ranks must call dispatch/combine in the same
// order with the same config.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "mxmoe/error.h"

namespace mxmoe {

inline constexpr int kMaxEpRanks = 64;       // one NVLink domain; the rank masks are 64-bit
inline constexpr int kMaxEpExperts = 1024;   // as moe_plan (kMaxExperts)
inline constexpr int kMaxEpTopK = 32;
inline constexpr int kMaxEpCtas = 1024;      // LSA barriers per device communicator

struct EpConfig {
  int hidden = 0;            // H: multiple of 32
  int top_k = 0;             // k: 1..min(32, num_experts)
  int num_experts = 0;       // E (all ranks): multiple of the world size
  int64_t max_tokens = 0;    // per rank; the window is sized for it
  int num_ctas = 0;          // CTAs of the dispatch/combine kernels (= LSA barrier count); 0 (default):
                             // one per SM. Run 55 (2 H200s, H 7168, k 8, T 4096): 32 CTAs move
                             // 260 GB/s, 66 300 GB/s, 132 318 GB/s (dispatch; 390 GB/s P2P copy)
  double timeout_s = 30.0;   // device barrier wait limit, and the id-file wait on ranks != 0
  bool bf16_rows = false;    // also hold the BF16 row and routing-weight regions (dispatch_bf16)
};

// The opaque NCCL unique id (NCCL_UNIQUE_ID_BYTES = 128), so this header needs no nccl.h.
struct EpUniqueId {
  char bytes[128];
};

// Byte layout of the symmetric window (see the top of this file).
struct EpWindowLayout {
  int64_t data_bytes = 0;       // H
  int64_t scale_bytes = 0;      // roundup(H/32, 16)
  int64_t ids_bytes = 0;        // roundup(4k, 16)
  int64_t record_bytes = 0;     // data + scales + ids (multiple of 16)
  int64_t dispatch_offset = 0;  // 0
  int64_t dispatch_bytes = 0;   // R · max_tokens · record_bytes
  int64_t combine_offset = 0;   // after dispatch, 4096-aligned
  int64_t combine_bytes = 0;    // max_tokens · k · H · 2
  int64_t bf16_offset = 0;      // after combine, 4096-aligned (cfg.bf16_rows; else 0 bytes)
  int64_t bf16_bytes = 0;       // R · max_tokens · H · 2
  int64_t weights_offset = 0;   // after the BF16 rows, 4096-aligned
  int64_t weights_bytes = 0;    // R · max_tokens · k · 4
  int64_t total_bytes = 0;      // rounded up to 4096 (NCCL_WIN_REQUIRED_ALIGNMENT)
};

// Pure host checks, no CUDA or NCCL call: throws mxmoe::Error naming the argument
// ('world_size', 'rank', 'cfg.hidden', 'cfg.num_experts', ...). EpComm runs them first.
void ep_check_config(const EpConfig& cfg, int rank, int world_size);
EpWindowLayout ep_window_layout(const EpConfig& cfg, int world_size);  // checks cfg first

class EpComm {
 public:
  // Collective over the world_size processes (one per GPU, same node, all in one NVLink/LSA team):
  // sets the device, ncclCommInitRank, checks that every rank has the same config (a small
  // min/max allreduce; a difference throws on every rank, naming the field), allocates the
  // window with ncclMemAlloc, registers it (NCCL_WIN_COLL_SYMMETRIC) and creates the device
  // communicator with lsaBarrierCount = cfg.num_ctas.
  EpComm(const EpConfig& cfg, int rank, int world_size, const EpUniqueId& id, int device);
  // Same, with the id exchanged through a file: rank 0 creates it (temp file + rename), the
  // other ranks wait for it up to cfg.timeout_s.
  EpComm(const EpConfig& cfg, int rank, int world_size, const std::string& id_file, int device);
  ~EpComm();
  EpComm(const EpComm&) = delete;
  EpComm& operator=(const EpComm&) = delete;

  static EpUniqueId new_unique_id();  // ncclGetUniqueId

  int rank() const;
  int world_size() const;
  int local_experts() const;        // E / R
  int device() const;               // the CUDA device of this rank (the constructor's cudaSetDevice):
                                    // every call below must run with it current, on a stream of it,
                                    // with device pointers on it (checked: mxmoe::Error naming the
                                    // argument, 'current device' or 'stream')
  const EpConfig& config() const;
  const EpWindowLayout& layout() const;

  // Sends this rank's MX-quantized tokens to the owners of their experts.
  //   x_data   E4M3 [tokens, H] (16-byte aligned), x_scales E8M0 [tokens, H/32] (row-wise MX,
  //   quantize_mxfp8); topk_ids int32 [tokens, k] global expert ids (an id outside [0, E) is
  //   dropped: sent nowhere, contributes nothing to the combine). 0 <= tokens <= max_tokens.
  // After it (stream order), on every rank: recv_records() holds the records of all sources and
  // recv_local_ids() [R · max_tokens, k] the local expert (0..E/R-1) of each (source s, token t,
  // slot j) at row s · max_tokens + t, or -1 when that slot's expert is not here.
  void dispatch(const uint8_t* x_data, const uint8_t* x_scales, const int32_t* topk_ids, int64_t tokens,
                cudaStream_t stream = nullptr);
  const uint8_t* recv_records() const;   // local window, R · max_tokens records of record_bytes
  const int32_t* recv_local_ids() const; // [R · max_tokens, k]

  // Gathers received rows into the padded expert layout of m_grouped_mxfp8_gemm_nt (its exact-mode
  // A operand: MX data + scales). Plan with moe_plan(recv_local_ids(), R · max_tokens, k, E/R, ...):
  //   row_index int32 [out_rows] (plan.row_index): record u = s · max_tokens + t, or < 0 for a pad
  //   row (zero data, zero scales); rows_used: optional device int32 (&plan.padded_offsets[E/R]),
  //   rows at or beyond it are not written. out_rows % 128 == 0.
  //   data E4M3 [out_rows, H] (16-byte aligned), scales E8M0 [out_rows, H/32].
  // The bytes equal quantize_mxfp8_gather's row-wise output on the source ranks. (The fast-form
  // operand — rebased per 128-chunk — is a later step.)
  void gather_recv_mx(const int32_t* row_index, int64_t out_rows, const int32_t* rows_used, uint8_t* data,
                      uint8_t* scales, cudaStream_t stream = nullptr) const;

  // Returns the expert outputs to the tokens' ranks and sums them there.
  //   y BF16 [y_rows, H] (16-byte aligned): this rank's expert outputs, in any layout;
  //   row_of int32 [R · max_tokens, k]: the row of y holding the output of (s, t, j), for every
  //   slot with recv_local_ids() >= 0 (other entries are ignored; a negative row sends nothing).
  //   topk_weights FP32 [tokens, k] of this rank's tokens; out BF16 [tokens, H] (16-byte aligned):
  //   out[t] = Σ_j w[t, j] · Y(t, j) in FP32, j = 0..k-1, rounded once (moe_combine).
  //   tokens must equal the last dispatch's.
  void combine(const __nv_bfloat16* y, int64_t y_rows, const int32_t* row_of, const float* topk_weights,
               int64_t tokens, __nv_bfloat16* out, cudaStream_t stream = nullptr);

  // The combine's two halves, for a caller that sums the rows itself (EpMoeLayer adds the
  // router's dX and keeps the rows for the routing-weight gradient): combine_send moves the rows
  // (the combine kernel, both barriers); afterwards combine_rows() [max_tokens · k, H] holds
  // Y(t, j) at row t·k + j for every slot with a valid expert id, and home_rows() [max_tokens, k]
  // is t·k + j for those slots and -1 for the others (the row_of of moe_combine). Both stay valid
  // until the next combine_send/combine (or dispatch: home_rows) on this EpComm.
  void combine_send(const __nv_bfloat16* y, int64_t y_rows, const int32_t* row_of, int64_t tokens,
                    cudaStream_t stream = nullptr);
  const __nv_bfloat16* combine_rows() const;
  const int32_t* home_rows() const;

  // The fused combine (EpMoeLayer's default; docs/notes/ep.md, "Fused combine"): the caller's
  // kernel writes each output row straight into its combine slot (EpMoeLayer: the expert GEMM's
  // row epilogue), and combine_commit publishes them; no copy of y.
  //   combine_targets: targets [rows] (device, 8-byte aligned) gets, for each padded row r of the
  //   local layout, the address (as this GPU maps it, a peer's window or ours) of the combine slot
  //   that combine_send(y, rows, row_of, ...) would copy y[r] to: row_index[r] = u = s·max_tokens + t
  //   (moe_plan over recv_local_ids(), its row_index), the slot j with recv_local_ids() >= 0 and
  //   row_of[u·k + j] == r, i.e. row t·k + j of rank s's combine region; null for rows no slot
  //   names (pad rows) and rows at or beyond *rows_used (optional device int32). Valid until the
  //   next dispatch; reads the last dispatch's recv_local_ids(). rows <= 2^31.
  //   The writer may write into a slot of rank s only once s has finished reading its combine
  //   region (its last combine sum): after a dispatch in this rank's stream (the dispatch's barriers
  //   order it after rank s's earlier work), as EpMoeLayer does in every pass. It must complete its
  //   writes and order them at system scope before it ends (m_grouped_mxfp8_gemm_nt_to_rows does).
  //   combine_commit: then, in stream order, on every rank: the combine kernel's two barriers
  //   without its copies. Afterwards combine_rows() / home_rows() are as after combine_send. The
  //   barrier sequence is combine_send's, so ranks may mix the two forms in one step.
  void combine_targets(const int32_t* row_index, const int32_t* row_of, int64_t rows, const int32_t* rows_used,
                       void** targets, cudaStream_t stream = nullptr) const;
  void combine_commit(int64_t tokens, cudaStream_t stream = nullptr);

  // Dispatch of BF16 rows (needs cfg.bf16_rows): the same destinations, ids records and
  // recv_local_ids() as dispatch(), but the payload is x BF16 [tokens, H] (16-byte aligned) and,
  // if topk_weights FP32 [tokens, k] is given, the token's k routing weights. After it (stream
  // order): recv_bf16_rows() [R · max_tokens, H] holds token t of source s at row s·max_tokens + t
  // for every (s, t) with an expert here (other rows: stale), recv_weights() [R · max_tokens, k]
  // likewise (when sent). The receiver's quantize_mxfp8_gather reads the rows in place.
  void dispatch_bf16(const __nv_bfloat16* x, const int32_t* topk_ids, const float* topk_weights, int64_t tokens,
                     cudaStream_t stream = nullptr);
  const __nv_bfloat16* recv_bf16_rows() const;
  const float* recv_weights() const;

  // Host-level collectives over the communicator (ordinary NCCL collectives, stream-ordered).
  //   all_gather: recv [R · bytes] = every rank's send [bytes], rank order.
  void all_gather(const void* send, void* recv, size_t bytes, cudaStream_t stream = nullptr);
  //   agree: collective set-up check, blocking. Every rank passes the same n named values and its
  //   own verdict (local_error empty = fine here). Throws mxmoe::Error on *every* rank if any rank
  //   has a local error (its message here; elsewhere naming the rank(s)) or any value differs across
  //   ranks (naming it, with its min and max). `who` prefixes the message.
  void agree(const char* who, const int64_t* values, const char* const* names, int n,
             const std::string& local_error);

  // The address of byte 0 of `peer`'s window (0 <= peer < R) as this GPU maps it: a plain device
  // pointer of this process (NVLink load/store, or cudaMemcpyAsync by the copy engine), valid while
  // this EpComm lives; peer == rank() gives the local window. Offsets are those of layout().
  // Synchronous (a one-thread kernel and a copy back): for set-up and measurements, not the step.
  // Writing a peer's window bypasses its barriers: the caller orders such writes (e.g. all_gather
  // + stream sync on every rank before and after).
  void* peer_window(int peer) const;

  // Synchronises `stream`, then throws mxmoe::CudaError if a device barrier timed out (naming
  // the kernel and the barrier) or NCCL reports an asynchronous error.
  void check(cudaStream_t stream = nullptr);

  struct Impl;

 private:
  Impl* impl_;
};

}  // namespace mxmoe

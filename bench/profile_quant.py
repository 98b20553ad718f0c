"""Launches each quantizer variant once on 16384x7168 (BF16) so that a profiler can look at it:
  ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \\
      --section WarpStateStats -k regex:quantize_mxfp8 python3 bench/profile_quant.py
Order: rowwise, colwise, row+col, row+col+fast; then the layer's permute + quantize of x at
DeepSeek-V3 EP8 size (a gather of 16384 tokens x 7168, top-8: 131072 rows, fast form alone,
both directions), the case that runs at 32-43% of copy."""
import torch

from common import check, load_lib, ptr, require_gpu

require_gpu()
lib = load_lib()
R, C = 16384, 7168
x = torch.randn(R, C, device="cuda").to(torch.bfloat16)
u8 = dict(dtype=torch.uint8, device="cuda")
rd, rs, rfd, rfs = torch.empty(R, C, **u8), torch.empty(R, C // 32, **u8), torch.empty(R, C, **u8), torch.empty(C // 128, R, **u8)
cd, cs, cfd, cfs = torch.empty(C, R, **u8), torch.empty(C, R // 32, **u8), torch.empty(C, R, **u8), torch.empty(R // 128, C, **u8)
N = None
for args in ([rd, rs, N, N, N, N, N, N], [N, N, N, N, cd, cs, N, N], [rd, rs, N, N, cd, cs, N, N],
             [rd, rs, rfd, rfs, cd, cs, cfd, cfs]):
    check(lib, lib.mxmoe_quantize_mxfp8(ptr(x), 1, R, C, *[ptr(a) for a in args], 0, None))
# gather: each expert segment holds the tokens routed to it in increasing order (as moe_plan does)
T, k, E = R, 8, 32
ids = torch.stack([torch.randperm(E, device="cuda")[:k] for _ in range(64)]).repeat(T // 64, 1)
flat = ids.reshape(-1)
order = torch.argsort(flat, stable=True)
row_index = (order // k).to(torch.int32)
rows = T * k
used = torch.tensor([rows], dtype=torch.int32, device="cuda")
gfd, gfs = torch.empty(rows, C, **u8), torch.empty(C // 128, rows, **u8)
gcd, gcs = torch.empty(C, rows, **u8), torch.empty(rows // 128, C, **u8)
check(lib, lib.mxmoe_quantize_mxfp8_gather(ptr(x), R, C, ptr(row_index), rows, ptr(used),
                                           *[ptr(a) for a in (N, N, gfd, gfs, N, N, gcd, gcs)], 0, None))
torch.cuda.synchronize()
print("done")

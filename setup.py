# Builds the PyTorch binding of mxmoe: the Python package python/mxmoe with the extension
# mxmoe._C, which compiles the project's kernels (src/kernels/**/*.cu), host code (src/host/*.cpp;
# the C ABI c_api*.cc and the NCCL-based expert parallelism are left out) and the op
# registrations (python/csrc/*.cpp).
#
#   pip install . --no-build-isolation            (needs torch, nvcc 13 and a C++17 g++)
#   pip install --no-build-isolation --no-deps -e .
#
# Hopper only (sm_90a). MAX_JOBS=N sets the parallel compile jobs when ninja is present.
import glob
import os

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def rel(pattern, recursive=False):
    """Sorted source paths matching pattern, relative to the repository root (setuptools wants
    relative paths)."""
    paths = glob.glob(os.path.join(ROOT, pattern), recursive=recursive)
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def extensions():
    from torch.utils.cpp_extension import CUDAExtension

    # Expert parallelism (src/kernels/ep, src/host/ep_comm.cpp) needs NCCL and is not bound yet;
    # ep_config.cpp (pure checks) is kept, as in CMake's mxmoe library.
    is_ep = lambda p: p.startswith(os.path.join("src", "kernels", "ep") + os.sep) or (
        os.path.basename(p).startswith("ep_") and os.path.basename(p) != "ep_config.cpp")
    sources = [p for p in rel("src/kernels/**/*.cu", recursive=True) + rel("src/host/*.cpp") if not is_ep(p)]
    sources += rel("python/csrc/*.cpp")
    include_dirs = [os.path.join(ROOT, "include"), os.path.join(ROOT, "src")]
    cutlass = os.path.join(ROOT, ".deps", "cutlass", "include")  # CuTe's GMMA atoms (the GEMMs' wgmma)
    if not os.path.isdir(os.path.join(cutlass, "cute")):
        raise SystemExit(f"mxmoe: CUTLASS/CuTe headers not found in {cutlass}: run scripts/deps.sh first")
    include_dirs.append(cutlass)
    nvcc = [
        "-O3",
        "-std=c++17",
        "-gencode=arch=compute_90a,code=sm_90a",
        "--expt-relaxed-constexpr",
        "-lineinfo",
        # torch adds these four for its own half/bfloat16 types; the kernels are written against
        # plain cuda_bf16.h, as the CMake build compiles them.
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__",
    ]
    cxx = ["-O3", "-std=c++17"]
    return [
        CUDAExtension(
            name="mxmoe._C",
            sources=sources,
            include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx, "nvcc": nvcc},
            # Keep in step with target_link_libraries(mxmoe ...) in CMakeLists.txt: cuBLAS (router
            # logits of the layer). torch's CUDAExtension adds cudart, c10_cuda and torch_cuda.
            # The GEMM's TMA descriptors are encoded through cudaGetDriverEntryPointByVersion
            # (src/kernels/gemm/tensor_map.cu), so libcuda is not linked.
            libraries=["cublas"],
            # libstdc++ must be the process's shared one: a compiler that links it statically by
            # default (as the GPU machine's /opt/gcc does) puts a second copy of the iostream/locale
            # machinery in _C.so, whose num_put facet is never set up, so formatting a number in an
            # error message crashed (run 20: segfault in std::ostream::_M_insert<long>). Naming the
            # shared library first resolves every std:: symbol there before any static archive.
            extra_link_args=["-l:libstdc++.so.6"],
        )
    ]


def cmdclass():
    from torch.utils.cpp_extension import BuildExtension

    return {"build_ext": BuildExtension}


setup(
    name="mxmoe",
    version="0.1.0",
    description="MXFP8 Mixture-of-Experts kernels for Hopper (sm_90a): PyTorch ops",
    package_dir={"": "python"},
    packages=["mxmoe"],
    ext_modules=extensions(),
    cmdclass=cmdclass(),
    python_requires=">=3.10",
    zip_safe=False,
    # Keep setuptools' objects out of build/ (the CMake build folder).
    options={"build": {"build_base": "build-py"}},
)

"""Build of hfreduce's compiled kernel (everything else is in pyproject.toml)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "hfreduce._kernels",
            ["src/hfreduce/_kernels.c"],
            # -O3: vectorize the kernel's loops (a clone per ISA); -fno-fast-math after any CFLAGS: the sums must
            # stay bit-identical to numpy's (the source refuses to build with fast-math or x87 floats)
            extra_compile_args=["-O3", "-fno-fast-math", "-Wall", "-Wextra"],
        )
    ]
)

"""Build of hfreduce's compiled kernel (everything else is in pyproject.toml)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "hfreduce._kernels",
            ["src/hfreduce/_kernels.c"],
            # -O3: vectorize the kernel's loops (target clones per ISA); never -ffast-math (the sums must stay
            # bit-identical to numpy's)
            extra_compile_args=["-O3", "-Wall", "-Wextra"],
        )
    ]
)

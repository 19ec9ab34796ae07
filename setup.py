"""The optional CPU kernels of the ``cpu_kernels`` ops backend (decoding and the train step)
(``t5like/kernels/*.cc``) against XLA's FFI headers (jaxlib's). Everything else is in
pyproject.toml. Without a C++ compiler the extension is skipped with a warning, and the model uses
XLA's own operations (``t5like.ops``).
"""
import os

from setuptools import Extension, setup


def _kernels() -> list[Extension]:
  try:
    import jaxlib  # A build requirement (pyproject.toml): its wheel ships the FFI headers.
  except ImportError:  # e.g. --no-build-isolation in an environment without jaxlib.
    print("warning: jaxlib not importable at build time; CPU kernels not built")
    return []
  return [Extension(
      "t5like.kernels._cpu",
      sources=["t5like/kernels/cache_attention.cc", "t5like/kernels/argmax.cc",
               "t5like/kernels/attention_train.cc", "t5like/kernels/head_norm.cc"],
      depends=["t5like/kernels/common.h", "t5like/kernels/tile.h"],
      language="c++",
      # XLA's FFI headers as system headers: their switches without a default return warn
      # (-Wreturn-type) under GCC; the kernels' own code keeps every default warning.
      extra_compile_args=["-O3", "-std=c++17", "-Wno-attributes", "-isystem",
                          os.path.join(os.path.dirname(jaxlib.__file__), "include")],
      optional=True,  # No compiler: a warning, and XLA's own operations at run time.
  )]


setup(ext_modules=_kernels())

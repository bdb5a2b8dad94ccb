"""Root conftest, shared by `tests/` and the doctests in `filterax/`.

- Eight simulated CPU devices, for the multi-device tests. This must run before
  JAX creates its backends, so it happens at import time.
- XLA's backend (LLVM) optimisation is off: the suite compiles thousands of
  small programs whose run time is negligible, and optimising their machine
  code was about a third of the suite's time. It changes no result the tests
  check: XLA's own passes (fusion, layout, buffer assignment, the cost and
  memory analyses) still run. The subprocesses the tests start inherit it.
- The compiled-code caches (JAX's and filterax's) are dropped after each test
  module, and the freed heap handed back to the system, bounding memory.
- Under CI (`CI` set), hypothesis draws the same examples on every run, so that a
  landing is never decided by a lucky or unlucky draw; local runs keep exploring.
"""

import ctypes
import gc
import os

import jax
import pytest

jax.config.update("jax_num_cpu_devices", 8)

_FAST_COMPILE = "--xla_backend_optimization_level=0"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()
    )

try:
    import hypothesis
except ImportError:  # the doctests alone need no hypothesis
    pass
else:
    hypothesis.settings.register_profile("ci", derandomize=True, deadline=None)
    if os.environ.get("CI"):
        hypothesis.settings.load_profile("ci")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_code():
    """Drops the caches of compiled code after each test module (JAX's and
    filterax's, whose compiled functions hold JAX's), then hands the freed
    heap back to the system: one process would otherwise keep every
    executable of the suite alive (4.5 GB at the peak), and the C allocator
    keeps freed pages mapped."""
    yield
    import filterax

    filterax.clear_caches()
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> ctypes.CDLL | None:
    """glibc, for `malloc_trim`; `None` elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()

"""Test-wide setup: eight simulated CPU devices for the multi-device tests.

This must run before JAX creates its backends, so it happens at import time.
"""

import jax

jax.config.update("jax_num_cpu_devices", 8)

"""Root conftest: the doctests in `filterax/` see eight simulated CPU devices too."""

import jax

jax.config.update("jax_num_cpu_devices", 8)

"""torch.distributed for tpu_dist: `init_process_group` publishes its `world_size` while it runs.

Under `mp.spawn` nothing in the environment says how many processes there are before the group exists,
yet torch checks `device_id=tpu:rank` against `torch.accelerator.device_count()` inside that call; for
tpu_dist that index names the process's own device, so the job's size is the right bound
(`hf_tpu.runtime.distributed.registration.world_size_being_initialized`, which `torch_accelerator`'s
`device_count` reads). Applied at `import hf_tpu` through `patching.patch`; `torch.distributed`'s
re-export is rebound.
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType

from hf_tpu.integrations.patching import patch


def publish_world_size(c10d: ModuleType) -> None:
    """Wrap `torch.distributed.distributed_c10d.init_process_group` (see the module docstring)."""
    from hf_tpu.runtime.distributed import registration

    def make(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def init_process_group(*args, **kwargs):
            try:
                size = signature.bind(*args, **kwargs).arguments.get("world_size", -1)
            except TypeError:  # torch reports bad arguments itself
                size = -1
            with registration.world_size_initializing(size):
                return original(*args, **kwargs)

        return init_process_group

    patch(c10d, "init_process_group", make, rebind=("init_process_group",))

"""The integration patches apply whatever the import order, and `import torch` does not import transformers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

CHECK = """
import sys
import accelerate.utils, accelerate.utils.modeling, accelerate.state
import transformers.integrations.accelerate as hf_acc
from hf_tpu.integrations.patching import is_patched
mine = "hf_tpu.integrations.accelerate"
assert accelerate.utils.modeling.get_max_memory.__module__ == mine, "accelerate.utils.modeling"
assert accelerate.utils.get_max_memory.__module__ == mine, "accelerate.utils"
assert hf_acc.accelerate_max_memory.__module__ == mine, "transformers' copy"
assert is_patched(hf_acc, "check_and_set_device_map")
assert is_patched(accelerate.state.PartialState, "default_device")
memory = accelerate.utils.get_max_memory()
assert list(memory)[0] == 0 and memory[0] > 0, memory
print("OK")
"""

ORDERS = {
    # the user never imports hf_tpu: torch's device-backend autoload installs the hooks
    "autoload": "import torch\n",
    "hf_tpu_first": "import hf_tpu\n",
    # HF libraries imported before hf_tpu registers (autoload off): patched when hf_tpu is imported
    "transformers_first": "import transformers.integrations.accelerate, accelerate.state\nimport hf_tpu\n",
}


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )


@pytest.mark.parametrize(
    "order",
    # `import hf_tpu` first is what autoload does anyway (torch's entry point imports hf_tpu)
    [pytest.param(o, marks=[pytest.mark.slow] if o == "hf_tpu_first" else []) for o in sorted(ORDERS)],
)
def test_patches_apply_in_any_import_order(order):
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"} if order == "transformers_first" else {}
    result = _run(ORDERS[order] + CHECK, **env)
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), result.stderr[-3000:]


def test_import_torch_does_not_import_hugging_face():
    result = _run(
        """
        import sys, torch
        assert torch.accelerator.current_accelerator().type == "tpu"
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("transformers", "accelerate", "diffusers"))
        assert not loaded, loaded
        print("OK")
        """
    )
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


def test_patches_survive_reload():
    import importlib

    import accelerate.utils.modeling as modeling

    importlib.reload(modeling)
    assert modeling.get_max_memory.__module__ == "hf_tpu.integrations.accelerate"
    assert list(modeling.get_max_memory())[0] == 0


# a transformers module imported first imports torch from its own body: torch's autoload then imports
# hf_tpu while that module is half-executed; its patches must wait until it has finished
HALF_IMPORTED = {
    "modeling_utils": (
        "import transformers.modeling_utils as target",
        "from hf_tpu.integrations.patching import is_patched\n    "
        "assert is_patched(target.PreTrainedModel, 'from_pretrained')",
    ),
    "testing_utils": (
        "import transformers.testing_utils as target",
        "assert target.BACKEND_DEVICE_COUNT['tpu']() == 1",
    ),
}


@pytest.mark.parametrize("entry", sorted(HALF_IMPORTED))
def test_a_module_that_imports_torch_first_is_patched_once_it_has_finished(entry):
    first, check = HALF_IMPORTED[entry]
    code = f"""
    import warnings
    warnings.simplefilter("always")
    {first}
    from transformers import LlamaConfig  # the user's next import
    {check}
    print("OK")
    """
    result = _run(code, TRANSFORMERS_TEST_DEVICE="tpu")
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), result.stderr[-3000:]
    assert "could not patch" not in result.stderr, result.stderr[-3000:]

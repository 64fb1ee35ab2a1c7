"""diffusers: models and pipelines placed on tpu by device_map strategies (they saw only CPU before)."""

from __future__ import annotations

import pytest
import torch

from tests.hf_models import tiny_unet
from tests.integrations.conftest import all_on


@pytest.fixture(scope="module")
def unet_path(tmp_path_factory):
    torch.manual_seed(0)
    unet, _ = tiny_unet()
    path = tmp_path_factory.mktemp("unet")
    unet.save_pretrained(path)
    return unet, path


@pytest.mark.parametrize("device_map", ["auto", "balanced", "sequential", "tpu"])
def test_model_device_map_places_on_tpu(unet_path, device_map):
    from diffusers import UNet2DConditionModel

    unet, path = unet_path
    loaded = UNet2DConditionModel.from_pretrained(path, device_map=device_map)
    assert all_on(loaded, "tpu")
    for (name, p), q in zip(loaded.named_parameters(), unet.parameters()):
        assert torch.equal(p.cpu(), q), name


def test_model_auto_with_max_memory_too_small_is_an_error(unet_path):
    from diffusers import UNet2DConditionModel

    _, path = unet_path
    with pytest.raises(ValueError, match=r"could not place any part of UNet2DConditionModel .* on tpu"):
        UNet2DConditionModel.from_pretrained(path, device_map="auto", max_memory={0: "1KB", "cpu": "1GB"})


def test_pipeline_balanced_places_components_on_tpu(unet_path, tmp_path):
    from diffusers import DDPMPipeline, DDPMScheduler, DiffusionPipeline, UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
    )
    DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=10)).save_pretrained(tmp_path)
    pipe = DiffusionPipeline.from_pretrained(tmp_path, device_map="balanced")
    assert pipe.hf_device_map == {"unet": 0}
    assert all_on(pipe.unet, "tpu")


@pytest.mark.parametrize(
    "device", ["tpu", "tpu:0", torch.device("tpu")], ids=["str", "str_index", "torch_device"]
)
def test_safetensors_load_file_onto_tpu(tmp_path, device):
    """safetensors parses device names itself and refused "tpu" (diffusers' disk group offloading
    reloads with `load_file(path, device=onload_device)`)."""
    import safetensors.torch

    path = str(tmp_path / "w.safetensors")
    tensors = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([1, 2], dtype=torch.int64)}
    safetensors.torch.save_file(tensors, path)
    loaded = safetensors.torch.load_file(path, device=device)
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].device.type == "tpu" and loaded[name].dtype == tensor.dtype
        assert torch.equal(loaded[name].cpu(), tensor)
    assert safetensors.torch.load_file(path)["a"].device.type == "cpu"


def test_safe_open_onto_tpu_and_accelerate_mixed_device_maps(tmp_path):
    """`safe_open(..., device="tpu")`: accelerate's `load_state_dict` opens the file once per device
    when a device map mixes "tpu" and "cpu" (it refused "tpu" as a device name)."""
    import safetensors
    from accelerate.utils.modeling import load_state_dict

    path = str(tmp_path / "w.safetensors")
    tensors = {"0.weight": torch.randn(4, 4), "1.weight": torch.randn(2, 4)}
    safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})
    with safetensors.safe_open(path, framework="pt", device="tpu") as f:
        assert sorted(f.keys()) == sorted(tensors) and f.metadata() == {"format": "pt"}
        got = f.get_tensor("0.weight")
        assert got.device.type == "tpu" and torch.equal(got.cpu(), tensors["0.weight"])
    loaded = load_state_dict(path, device_map={"0": "tpu", "1": "cpu"})
    assert {k: v.device.type for k, v in loaded.items()} == {"0.weight": "tpu", "1.weight": "cpu"}
    assert all(torch.equal(loaded[k].cpu(), v) for k, v in tensors.items())

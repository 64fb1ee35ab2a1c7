"""The mesh and sharding API on 8 forced host chips: placement, per-chip accounting, and every bad input."""

import pytest
import torch

import hf_tpu
from hf_tpu.runtime.buffers.placement import MeshMismatchError, PlacementError


def test_default_mesh_is_every_chip_on_one_model_axis():
    mesh = hf_tpu.mesh()
    assert dict(mesh.shape) == {"model": 8}
    assert len(mesh.devices.flat) == 8
    from jax.sharding import AxisType

    assert mesh.axis_types == (AxisType.Auto,)


def test_use_mesh_sets_a_2d_mesh_for_the_block_and_restores_the_previous():
    before = hf_tpu.mesh()
    with hf_tpu.use_mesh((2, 4), ("data", "model")) as mesh:
        assert hf_tpu.mesh() is mesh and dict(mesh.shape) == {"data": 2, "model": 4}
        t = hf_tpu.shard(torch.randn(4, 8).to("tpu"), ("data", "model"))
        assert hf_tpu.sharding(t) == ("data", "model")
    assert hf_tpu.mesh() is before


def test_shard_lays_a_whole_tensor_out_in_place_and_values_stay():
    cpu = torch.randn(16, 8)
    t = cpu.to("tpu")
    out = hf_tpu.shard(t, ("model", None))
    assert out is t
    assert hf_tpu.sharding(t) == ("model", None)
    assert torch.equal(t.cpu(), cpu)
    param = torch.nn.Parameter(torch.randn(8, 16).to("tpu"))
    assert hf_tpu.shard(param, (None, "model")) is param and isinstance(param, torch.nn.Parameter)
    assert hf_tpu.sharding(param) == (None, "model")


def test_shard_of_a_cpu_tensor_places_its_parts_and_of_a_view_gives_a_new_tensor():
    cpu = torch.arange(64.0).reshape(8, 8)
    t = hf_tpu.shard(cpu, (None, "model"))
    assert t.device.type == "tpu" and hf_tpu.sharding(t) == (None, "model")
    assert torch.equal(t.cpu(), cpu)
    view = t[2:6]
    placed = hf_tpu.shard(view.t(), ("model", None))
    assert placed is not view and hf_tpu.sharding(placed) == ("model", None)
    assert torch.equal(placed.cpu(), cpu[2:6].t())


def test_replicate_and_sharding_of_unsharded_tensors():
    t = torch.randn(4, 4, device="tpu")
    assert hf_tpu.sharding(t) == (None, None)
    from hf_tpu.runtime.tensors.sharding import placed_on_mesh

    assert not placed_on_mesh(t)
    hf_tpu.replicate(t)
    assert placed_on_mesh(t) and hf_tpu.sharding(t) == (None, None)
    assert hf_tpu.sharding(torch.ones(3)) == (None,)  # a CPU tensor: not split


def test_per_chip_accounting_counts_shards_replicas_and_unsharded_buffers():
    import gc

    gc.collect()
    before = torch.tpu.memory_allocated_per_chip()
    total_before = torch.tpu.memory_allocated()
    sharded = hf_tpu.shard(torch.zeros(64, 32).to("tpu"), ("model", None))  # 8 KiB, 1 KiB per chip
    after = torch.tpu.memory_allocated_per_chip()
    assert [a - b for a, b in zip(after, before)] == [1024] * 8
    replicated = hf_tpu.replicate(torch.zeros(16, 16).to("tpu"))  # 1 KiB on every chip
    after2 = torch.tpu.memory_allocated_per_chip()
    assert [a - b for a, b in zip(after2, after)] == [1024] * 8
    unsharded = torch.ones(256, device="tpu")  # 1 KiB on the first chip
    after3 = torch.tpu.memory_allocated_per_chip()
    assert [a - b for a, b in zip(after3, after2)] == [1024] + [0] * 7
    assert torch.tpu.memory_allocated() - total_before == 8192 + 1024 + 1024  # distinct bytes
    free, total = torch.tpu.mem_get_info()
    from hf_tpu.runtime.buffers import memory

    assert total == memory.chip_capacity() * 8
    del sharded, replicated, unsharded


def test_zeros_like_follows_the_placement_of_its_model():
    w = hf_tpu.shard(torch.randn(16, 8).to("tpu"), ("model", None))
    for like in (torch.zeros_like(w), torch.ones_like(w), torch.randn_like(w), torch.full_like(w, 2.0)):
        assert hf_tpu.sharding(like) == ("model", None)
    assert torch.equal(torch.ones_like(w).cpu(), torch.ones(16, 8))


def test_in_place_ops_keep_the_destination_placement():
    w = hf_tpu.shard(torch.zeros(16, 8).to("tpu"), ("model", None))
    w.fill_(3.0)
    w.add_(torch.ones(16, 8, device="tpu"))  # an unsharded operand
    w[2:5, :] = 7.0
    assert hf_tpu.sharding(w) == ("model", None)
    expected = torch.full((16, 8), 4.0)
    expected[2:5] = 7.0
    assert torch.equal(w.cpu(), expected)


# -- bad input --------------------------------------------------------------------------------------
def test_a_spec_naming_an_axis_the_mesh_lacks_says_which():
    with pytest.raises(PlacementError, match=r"names axis 'data', which the mesh \{'model': 8\} lacks"):
        hf_tpu.shard(torch.randn(8, 8).to("tpu"), ("data", None))


def test_a_spec_longer_than_the_rank_is_refused():
    with pytest.raises(PlacementError, match=r"has 3 entries but tensor of shape \(8, 8\) has 2 dims"):
        hf_tpu.shard(torch.randn(8, 8).to("tpu"), ("model", None, None))


def test_a_dim_that_does_not_divide_over_the_axis_is_refused():
    with pytest.raises(PlacementError, match=r"dim 1 \(size 5\) does not divide into 8 parts"):
        hf_tpu.shard(torch.randn(3, 5).to("tpu"), (None, "model"))


def test_an_axis_used_twice_is_refused():
    with hf_tpu.use_mesh((2, 4), ("data", "model")):
        with pytest.raises(PlacementError, match="splits both dim 0 and dim 1"):
            hf_tpu.shard(torch.randn(8, 8).to("tpu"), ("model", "model"))


def test_a_mesh_bigger_than_the_chips_is_refused():
    with pytest.raises(PlacementError, match=r"needs 16 chips but this host has 8"):
        hf_tpu.set_mesh((4, 4), ("a", "b"))
    with pytest.raises(PlacementError, match="one name"):
        hf_tpu.set_mesh((2, 4), ("a",))
    with pytest.raises(PlacementError, match="its own name"):
        hf_tpu.set_mesh((2, 4), ("a", "a"))


def test_an_unknown_policy_is_refused():
    from hf_tpu.integrations.sharding import ShardingPolicyError

    with pytest.raises(
        ShardingPolicyError, match="unknown sharding policy 'tensor': use one of tp, fsdp, replicate"
    ):
        with hf_tpu.sharding_policy("tensor"):
            pass


def test_mixing_tensors_of_meshes_over_other_chips_names_the_mismatch():
    with hf_tpu.use_mesh((4,), ("model",)):
        on_four = hf_tpu.shard(torch.randn(8, 8).to("tpu"), ("model", None))
    on_eight = hf_tpu.shard(torch.randn(8, 8).to("tpu"), ("model", None))
    with pytest.raises(MeshMismatchError, match=r"different sets of chips.*hf_tpu.shard"):
        (on_four + on_eight).cpu()
    # meshes over the same chips mix: XLA reshards (same values as CPU)
    with hf_tpu.use_mesh((2, 4), ("data", "model")):
        other = hf_tpu.shard(torch.ones(8, 8).to("tpu"), ("data", "model"))
    assert torch.equal((on_eight + other).cpu(), on_eight.cpu() + 1)


def test_shard_of_a_non_tensor_and_of_a_meta_tensor():
    with pytest.raises(TypeError, match="expects a torch.Tensor"):
        hf_tpu.shard([1, 2], ("model",))
    with pytest.raises(PlacementError, match="is on meta"):
        hf_tpu.shard(torch.empty(8, device="meta"), ("model",))


def test_views_of_a_split_buffer_stay_split_when_read():
    """weight.t() of a row-split weight, a head split of a column-split projection, a slice along the split
    dim: read in N-D, so the read keeps the split and gathers nothing to one chip."""
    from hf_tpu.runtime.buffers.storage import REGISTRY
    from hf_tpu.runtime.tensors import tensor as tt

    w = hf_tpu.shard(torch.randn(16, 64), (None, "model"))
    assert hf_tpu.sharding(w.t()) == ("model", None)
    torch.testing.assert_close(w.t().cpu(), w.cpu().t())
    h = hf_tpu.shard(torch.randn(2, 5, 64), (None, None, "model"))
    heads = h.view(2, 5, 8, 8).transpose(1, 2)
    assert hf_tpu.sharding(heads) == (None, "model", None, None)
    torch.testing.assert_close(heads.cpu(), h.cpu().view(2, 5, 8, 8).transpose(1, 2))
    cpu = torch.randn(64, 8)
    rows = hf_tpu.shard(cpu, ("model", None))[8:40]
    assert hf_tpu.sharding(rows) == ("model", None)  # 32 rows over 8 chips: still split
    torch.testing.assert_close(rows.cpu(), cpu[8:40])
    # the read kernel XLA compiled for the transpose holds no all-gather
    array = REGISTRY.payload(w.untyped_storage().data_ptr()).array
    view = w.t()
    read = tt._read_nd(tuple(w.shape), tuple(view.shape), view.stride())
    text = (
        read.lower(array, tt._nd_starts(tuple(w.shape), tuple(view.shape), view.stride(), 0))
        .compile()
        .as_text()
    )
    assert "all-gather" not in text and "all-to-all" not in text

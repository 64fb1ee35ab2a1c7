"""Compiled graphs on sharded tensors: one SPMD program, and inputs it overwrites are still donated."""

import warnings

import torch

import hf_tpu


def _shard_pointers(t) -> list[int]:
    from hf_tpu.runtime.buffers.storage import REGISTRY

    array = REGISTRY.payload(t.untyped_storage().data_ptr()).array
    return [s.data.unsafe_buffer_pointer() for s in array.addressable_shards]


def _kv_step(cache, pos, new):
    cache.index_copy_(2, pos, new)
    return cache.sum(-1)


def test_a_cache_split_by_heads_is_updated_in_place_by_the_compiled_step():
    torch.manual_seed(0)
    cache = torch.zeros(1, 8, 6, 4)
    dev_cache = hf_tpu.shard(torch.zeros(1, 8, 6, 4, device="tpu"), (None, "model", None, None))
    step = torch.compile(_kv_step, backend="tpu")
    in_place = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            pos, new = torch.tensor([i]), torch.randn(1, 8, 1, 4)
            before = _shard_pointers(dev_cache)
            out = step(dev_cache, pos.to("tpu"), hf_tpu.shard(new, (None, "model", None, None)))
            in_place.append(_shard_pointers(dev_cache) == before)
            ref = _kv_step(cache, pos, new)
            torch.testing.assert_close(out.cpu(), ref)
            torch.testing.assert_close(dev_cache.cpu(), cache)
    assert hf_tpu.sharding(dev_cache) == (None, "model", None, None)
    assert in_place[1:] == [True, True], f"the split KV buffer was copied, not updated in place: {in_place}"
    assert not [w for w in caught if "donated" in str(w.message)]


def test_a_sharded_matmul_chain_compiles_to_one_program_with_the_collectives_gspmd_needs():
    w1 = hf_tpu.shard(torch.randn(64, 32), ("model", None))  # column parallel (output features split)
    w2 = hf_tpu.shard(torch.randn(32, 64), (None, "model"))  # row parallel (input features split)
    x = torch.randn(4, 32)
    fn = torch.compile(
        lambda a: torch.nn.functional.linear(torch.nn.functional.linear(a, w1).relu(), w2), backend="tpu"
    )
    before = {p.name for p in hf_tpu.compiled_programs()}
    out = fn(x.to("tpu"))
    expected = torch.nn.functional.linear(torch.nn.functional.linear(x, w1.cpu()).relu(), w2.cpu())
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
    (program,) = [p for p in hf_tpu.compiled_programs() if p.name not in before]
    text = program.compiled_text()
    assert text.count("all-reduce(") + text.count("all-reduce-start(") == 1  # Megatron's one per pair
    assert "all-gather" not in text

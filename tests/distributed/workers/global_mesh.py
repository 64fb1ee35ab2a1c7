"""`HF_TPU_MESH=global`: one mesh over every process's chips (argv: rank world_size ckpt_dir [extras], extras a
comma list of "compiled" and "generate").

Every rank runs this same program (multi-controller SPMD) and checks its own view against CPU PyTorch:
the mesh spans the job's chips while each process holds only its own; a tensor split over the whole mesh
has local shards only here and reads back whole; elementwise ops, a matmul, reductions, scalar reads and a
sharded Linear pair (forward and backward) and a 2-D mesh equal CPU; a tiny Llama (built from a config,
saved, loaded with `device_map="tpu"` under the `tp` policy: every weight split over all the job's chips)
gives CPU's logits, eager and, with "compiled", under `torch.compile(backend="tpu")`; with "generate", its
greedy tokens; `save_pretrained` in every process writes CPU's weights. tpu_dist collectives next to the
global mesh. Exits 1 listing every failed check."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from checks import Checker  # noqa: E402

import hf_tpu  # noqa: E402
from hf_tpu.runtime.tensors.tensor import to_jax  # noqa: E402

rank, world = int(sys.argv[1]), int(sys.argv[2])
ckpt_root = sys.argv[3]
extras = set(sys.argv[4].split(",")) if len(sys.argv) > 4 else set()
check = Checker(rank)
TOL = {"rtol": 1e-4, "atol": 1e-4}


def data(shape: tuple, salt: int) -> torch.Tensor:
    """The same host value in every process (the global mesh's contract)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(salt))


def devices():
    import jax

    mesh = hf_tpu.mesh()
    assert mesh.devices.size == 4 * world, mesh
    assert len(jax.local_devices()) == 4 and torch.tpu.device_count() == 4
    assert {d.process_index for d in mesh.devices.flat} == set(range(world))
    assert jax.process_index() == rank


check.run("8 global devices, 4 local", devices)


def partial_mesh_refused():
    try:
        hf_tpu.set_mesh((4,), ("model",))
    except hf_tpu.PlacementError as exc:
        assert "uses 4 of the job's 8 chips" in str(exc) and "spans all the chips" in str(exc), exc
    else:
        raise AssertionError("a mesh over half the job was accepted")


check.run("a mesh over part of the job is refused, saying why", partial_mesh_refused)

x_cpu = data((16, 8), 1)
x = hf_tpu.shard(x_cpu, ("model", None))


def local_shards():
    import jax

    array = to_jax(x)
    local = set(jax.local_devices())
    shards = array.addressable_shards
    assert len(shards) == 4 and {s.device for s in shards} == local, shards
    assert not array.is_fully_addressable
    for s in shards:
        assert s.data.shape == (2, 8), s.data.shape
        torch.testing.assert_close(torch.from_numpy(s.data.__array__().copy()), x_cpu[s.index])
    assert hf_tpu.sharding(x) == ("model", None)


check.run("sharded tensor: local shards only", local_shards)
check.close("sharded tensor reads back", x, x_cpu)

y_cpu = data((16, 8), 2)
y = hf_tpu.shard(y_cpu, (None, "model"))  # split the other way: XLA reshards across processes
u_cpu = data((8,), 3)
u = u_cpu.to("tpu")  # unsharded: each process's copy of the same value
check.close("elementwise", x * 2 + torch.sin(y) - u, x_cpu * 2 + torch.sin(y_cpu) - u_cpu)
check.close("elementwise in place", x.clone().mul_(3).add_(y), x_cpu * 3 + y_cpu)
w_cpu = data((8, 24), 4)
w = hf_tpu.shard(w_cpu, (None, "model"))
check.close("matmul (rows x cols split)", x @ w, x_cpu @ w_cpu)
check.close("matmul (contracted dim split)", x.T @ y, x_cpu.T @ y_cpu)
check.close("sum over the split dim", x.sum(0), x_cpu.sum(0))
check.close("mean, amax", torch.stack([x.mean(), x.amax()]), torch.stack([x_cpu.mean(), x_cpu.amax()]))
check.close("softmax", torch.softmax(x, -1), torch.softmax(x_cpu, -1))
check.run("item", lambda: abs(x.sum().item() - x_cpu.sum().item()) < 1e-4 or 1 / 0)
check.run("tolist", lambda: torch.testing.assert_close(torch.tensor(x[3].tolist()), x_cpu[3]))
check.run("print", lambda: str(x[:2]).startswith("tensor([[") or 1 / 0)
check.run("replicate reads back", lambda: torch.testing.assert_close(hf_tpu.replicate(y).cpu(), y_cpu))


def defer_and_fuse():
    from hf_tpu.runtime.launch.modes import EagerMode, set_eager_mode

    set_eager_mode(EagerMode.DEFER_AND_FUSE)
    try:
        out = (torch.tanh(x @ w) * 3 + 1).sum(-1)
    finally:
        set_eager_mode(EagerMode.DEFER_NEVER)
    torch.testing.assert_close(out.cpu(), (torch.tanh(x_cpu @ w_cpu) * 3 + 1).sum(-1), **TOL)


check.run("DeferAndFuse (ops recorded, run as one program)", defer_and_fuse)


def sharded_linear():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    model.load_state_dict(ref.state_dict())
    model.to("tpu")
    hf_tpu.shard_module(model, policy="tp", plan={"0": "colwise", "2": "rowwise"})
    assert hf_tpu.sharding(model[0].weight) == ("model", None)
    assert hf_tpu.sharding(model[2].weight) == (None, "model")
    torch.testing.assert_close(model(x).cpu(), ref(x_cpu), **TOL)
    model(x).square().sum().backward()
    ref(x_cpu).square().sum().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        torch.testing.assert_close(param.grad.cpu(), ref.get_parameter(name).grad, **TOL)


check.run("sharded linear forward and backward", sharded_linear)


def two_d_mesh():
    """(2, 4) "data" x "model": each process's 4 chips make a "model" row, the batch splits over processes."""
    with hf_tpu.use_mesh((2, 4), ("data", "model")) as mesh:
        assert [{d.process_index for d in row} for row in mesh.devices] == [{0}, {1}]
        batch = hf_tpu.shard(x_cpu, ("data", None))
        weight = hf_tpu.shard(w_cpu, (None, "model"))
        torch.testing.assert_close((batch @ weight).relu().cpu(), (x_cpu @ w_cpu).relu(), **TOL)


check.run("2-D mesh: data over processes, model within", two_d_mesh)


def save_llama() -> str:
    """Each rank saves the same seeded model to a folder of its own (no process group to wait on)."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    path = os.path.join(ckpt_root, f"llama-rank{rank}")
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


LLAMA: dict = {}


def same_weights(path: str, ref) -> None:
    import transformers

    again = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for name, tensor in ref.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], tensor)


def llama():
    import transformers

    path = save_llama()
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, device_map="tpu")
    model.eval()
    q = model.model.layers[0].self_attn.q_proj.weight
    assert hf_tpu.sharding(q) == ("model", None), hf_tpu.sharding(q)
    assert len(to_jax(q).addressable_shards) == 4 and to_jax(q).sharding.mesh.devices.size == 4 * world
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = ref(ids).logits
        logits = model(ids.to("tpu")).logits
        assert len(to_jax(logits).sharding.device_set) == 4 * world  # computed over the job's chips
        torch.testing.assert_close(logits.cpu(), expected, **TOL)
        if "compiled" in extras:
            fast = torch.compile(model, backend="tpu")
            for _ in range(2):
                logits = fast(ids.to("tpu")).logits
                assert len(to_jax(logits).sharding.device_set) == 4 * world
                torch.testing.assert_close(logits.cpu(), expected, **TOL)
            assert hf_tpu.compiled_programs(), "torch.compile ran no tpu graph"
    if "generate" in extras:  # every process runs the same decode loop and reads the same tokens
        out = model.generate(ids.to("tpu"), max_new_tokens=4, do_sample=False)
        assert out.cpu().tolist() == ref.generate(ids, max_new_tokens=4, do_sample=False).tolist()
    # every process calls save_pretrained (reading a split weight is a collective); rank 0 writes
    saved = os.path.join(ckpt_root, "saved")
    model.save_pretrained(saved, is_main_process=rank == 0)
    if rank == 0:
        same_weights(saved, ref)
    LLAMA.update(path=path, ref=ref, model=model, ids=ids, expected=expected)


check.run(f"tiny llama from_pretrained(device_map='tpu'), save_pretrained {sorted(extras)}", llama)


def with_tpu_dist():
    """tpu_dist next to the global mesh: collectives take process-local tensors; a global one is refused
    by name on every rank; a collective's result meets the global mesh once replicated onto it."""
    import torch.distributed as dist

    dist.init_process_group("tpu_dist")
    t = torch.full((8,), float(rank + 1), device="tpu")
    dist.all_reduce(t)
    torch.testing.assert_close(t.cpu(), torch.full((8,), float(world * (world + 1) // 2)))
    try:
        dist.all_reduce(x)
    except Exception as exc:  # noqa: BLE001
        assert "placed on the global mesh (HF_TPU_MESH=global)" in str(exc), exc
        assert "all_reduce" in str(exc), exc
    else:
        raise AssertionError("all_reduce of a global tensor did not raise")
    try:
        x.sum(0) + t  # t lives on this process's first chip (committed there by the collective)
    except Exception as exc:  # noqa: BLE001
        assert "hf_tpu.replicate(t)" in str(exc) and "HF_TPU_MESH=global" in str(exc), exc
    else:
        raise AssertionError("a collective's result met a global tensor without the clear error")
    torch.testing.assert_close((x.sum(0) + hf_tpu.replicate(t)).cpu(), x_cpu.sum(0) + t.cpu())
    if LLAMA:  # with a process group, transformers writes from rank 0 only: every rank still gathers
        import transformers

        saved = os.path.join(ckpt_root, "saved-with-group")
        LLAMA["model"].save_pretrained(saved)
        dist.barrier()
        same_weights(saved, LLAMA["ref"])
        # tp_plan="auto" under a process group: hf_tpu's tp placement over the global mesh, not DTensor
        tp = transformers.AutoModelForCausalLM.from_pretrained(
            LLAMA["path"], dtype=torch.float32, tp_plan="auto"
        )
        q = tp.model.layers[0].self_attn.q_proj.weight
        assert type(q) is torch.nn.Parameter and hf_tpu.sharding(q) == ("model", None), type(q)
        with torch.no_grad():
            logits = tp(LLAMA["ids"].to("tpu")).logits.cpu()
        torch.testing.assert_close(logits, LLAMA["expected"], **TOL)
    dist.destroy_process_group()


check.run("tpu_dist collectives next to the global mesh", with_tpu_dist)
sys.exit(check.finish())

"""`from_pretrained(..., device_map="tpu")` over 8 chips: weights sharded as they load, outputs equal CPU.

Tiny Llama, Qwen3-MoE and Gemma-2 (tensor-parallel plans: the `tp` policy), T5 and BERT (no plan:
`fsdp`), built from configs and saved locally.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

import hf_tpu
from hf_tpu.integrations.sharding import FSDP_MIN_NUMEL
from hf_tpu.runtime.tensors.sharding import placed_on_mesh
from tests.multichip import zoo


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (CPU reference model, checkpoint folder)."""
    out = {}
    for name in zoo.MODELS:
        model = zoo.build(name)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        out[name] = (model, path)
    return out


def _load(saved, name, **kwargs):
    ref, path = saved[name]
    return type(ref).from_pretrained(path, device_map="tpu", **kwargs).eval()


def _split_ways(t: torch.Tensor) -> int:
    ways = 1
    sizes = dict(hf_tpu.mesh().shape)
    for entry in hf_tpu.sharding(t):
        if entry is not None:
            ways *= math.prod(sizes[n] for n in ((entry,) if isinstance(entry, str) else entry))
    return ways


@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_sharded_load_matches_cpu_and_spreads_the_weights(saved, name):
    import gc

    ref, _ = saved[name]
    gc.collect()
    before = torch.tpu.memory_allocated_per_chip()
    model = _load(saved, name)
    after = torch.tpu.memory_allocated_per_chip()
    batch = zoo.inputs(name)
    with torch.no_grad():
        expected = zoo.output(ref(**batch))
        actual = zoo.output(model(**zoo.on("tpu", batch))).cpu()
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    assert all(placed_on_mesh(t) for t in tensors.values()), "every weight and buffer lives on the mesh"
    params = dict(model.named_parameters())
    big = {n: p for n, p in params.items() if p.numel() >= 64 * 64}
    sharded = {n for n, p in big.items() if _split_ways(p) == 8}
    assert len(sharded) >= 0.75 * len(big), f"only {sorted(sharded)} of {sorted(big)} are split 8 ways"
    # each chip holds its share of every split tensor and a copy of every replicated one, nothing more
    share = sum(t.numel() * t.element_size() // _split_ways(t) for t in tensors.values())
    assert [a - b for a, b in zip(after, before)] == [share] * 8
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    replicated = sum(t.numel() * t.element_size() for t in tensors.values() if _split_ways(t) == 1)
    assert share <= 1.15 * (total - replicated) / 8 + replicated


@pytest.mark.parametrize("name", zoo.DECODERS + ("t5",))
def test_sharded_greedy_tokens_equal_cpu(saved, name):
    ref, _ = saved[name]
    model = _load(saved, name)
    ids = zoo.inputs(name)["input_ids"]
    mask = torch.ones_like(ids)
    kwargs = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, attention_mask=mask)
    expected = ref.generate(ids, **kwargs)
    actual = model.generate(ids.to("tpu"), **{**kwargs, "attention_mask": mask.to("tpu")}).cpu()
    assert torch.equal(actual, expected)


def _collectives(text: str) -> dict:
    return {
        k: len(re.findall(rf"\b{k}(?:-start)?\(", text)) for k in ("all-reduce", "all-gather", "all-to-all")
    }


def test_compiled_sharded_llama_is_one_spmd_program_with_megatron_collectives(saved):
    ref, _ = saved["llama"]
    model = _load(saved, "llama")
    before = {p.name for p in hf_tpu.compiled_programs()}
    compiled = torch.compile(model, backend="tpu")
    batch = zoo.inputs("llama")
    with torch.no_grad():
        actual = compiled(**zoo.on("tpu", batch)).logits.cpu()
        expected = ref(**batch).logits
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    new = [p for p in hf_tpu.compiled_programs() if p.name not in before]
    assert len(new) == 1, [p.name for p in new]  # one graph, one program
    counts = _collectives(new[0].compiled_text())
    layers = ref.config.num_hidden_layers
    # Megatron TP: o_proj and down_proj (row-parallel) each end in an all-reduce; the vocab-parallel
    # embedding sums its partial lookups with one more
    assert counts["all-reduce"] == 2 * layers + 1, counts


def test_sharded_training_step_matches_cpu_and_optimizer_state_follows_its_parameter(saved):
    ref, path = saved["llama"]
    cpu = type(ref).from_pretrained(path).train()
    model = _load(saved, "llama").train()
    # lr 1e-3: AdamW divides by sqrt(v), so an element whose gradient is ~0 turns reduction-order noise
    # (sums split over chips; XLA's order differs per host) into a sizeable fraction of a step: at lr 1e-2
    # one weight of 8192 ended 2.9e-4 from CPU on an AVX512-FP16 host (3e-5 at lr 1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cpu_opt = torch.optim.AdamW(cpu.parameters(), lr=1e-3)
    batch = zoo.inputs("llama")
    for _ in range(2):
        loss = model(**zoo.on("tpu", batch), labels=batch["input_ids"].to("tpu")).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        cpu_loss = cpu(**batch, labels=batch["input_ids"]).loss
        cpu_loss.backward()
        cpu_opt.step()
        cpu_opt.zero_grad()
    torch.testing.assert_close(loss.cpu(), cpu_loss.detach(), atol=1e-5, rtol=1e-5)
    for (n, p), (_, q) in zip(model.named_parameters(), cpu.named_parameters()):
        # two steps of up to 1e-3 each: a wrong gradient or a lost update is far beyond the tolerance
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=2e-4, rtol=1e-4)
        state = opt.state[p]
        assert hf_tpu.sharding(state["exp_avg"]) == hf_tpu.sharding(p), n
        assert hf_tpu.sharding(state["exp_avg_sq"]) == hf_tpu.sharding(p), n


def test_save_pretrained_from_a_sharded_model_writes_full_tensors(saved, tmp_path):
    ref, _ = saved["llama"]
    model = _load(saved, "llama")
    model.save_pretrained(tmp_path)
    reloaded = type(ref).from_pretrained(tmp_path)
    for (n, a), (_, b) in zip(reloaded.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), n


def test_tied_weights_stay_tied_when_sharded(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=8,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    model = LlamaForCausalLM.from_pretrained(tmp_path, device_map="tpu")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert hf_tpu.sharding(model.lm_head.weight) == ("model", None)


@pytest.mark.parametrize("policy", ["fsdp", "replicate"])
def test_policies_fsdp_and_replicate(saved, policy):
    ref, _ = saved["llama"]
    with hf_tpu.sharding_policy(policy):
        model = _load(saved, "llama")
    for n, p in model.named_parameters():
        assert placed_on_mesh(p), n
        if policy == "replicate" or p.numel() < FSDP_MIN_NUMEL:
            assert _split_ways(p) == 1, n
        else:
            spec = hf_tpu.sharding(p)
            dim = next(d for d, e in enumerate(spec) if e is not None)
            assert p.shape[dim] == max(p.shape), (n, spec)  # its largest dim
    batch = zoo.inputs("llama")
    with torch.no_grad():
        torch.testing.assert_close(
            model(**zoo.on("tpu", batch)).logits.cpu(), ref(**batch).logits, atol=1e-5, rtol=1e-5
        )


def test_the_environment_picks_the_policy(saved, monkeypatch):
    monkeypatch.setenv("HF_TPU_SHARDING", "replicate")
    model = _load(saved, "llama")
    assert all(_split_ways(p) == 1 for p in model.parameters())
    monkeypatch.setenv("HF_TPU_SHARDING", "pipeline")
    from hf_tpu.integrations.sharding import ShardingPolicyError

    with pytest.raises(ShardingPolicyError, match="unknown sharding policy 'pipeline'"):
        _load(saved, "llama")


def test_tp_plan_auto_in_one_process_is_the_tp_placement(saved):
    ref, path = saved["llama"]
    model = type(ref).from_pretrained(path, tp_plan="auto").eval()
    assert model.device.type == "tpu"
    assert hf_tpu.sharding(model.model.layers[0].self_attn.o_proj.weight) == (None, "model")
    batch = zoo.inputs("llama")
    with torch.no_grad():
        torch.testing.assert_close(
            model(**zoo.on("tpu", batch)).logits.cpu(), ref(**batch).logits, atol=1e-5, rtol=1e-5
        )


def test_2d_mesh_data_and_tensor_parallel_forward_and_training(saved):
    ref, path = saved["llama"]
    cpu = type(ref).from_pretrained(path).train()
    with hf_tpu.use_mesh((2, 4), ("data", "model")):
        model = _load(saved, "llama").train()
        assert hf_tpu.sharding(model.model.layers[0].mlp.down_proj.weight) == (None, "model")
        batch = zoo.inputs("llama")
        ids = hf_tpu.shard(batch["input_ids"], ("data", None))
        assert hf_tpu.sharding(ids) == ("data", None)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cpu_opt = torch.optim.SGD(cpu.parameters(), lr=0.1)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        cpu_loss = cpu(**batch, labels=batch["input_ids"]).loss
        cpu_loss.backward()
        cpu_opt.step()
        torch.testing.assert_close(loss.cpu(), cpu_loss.detach(), atol=1e-5, rtol=1e-5)
        for (n, p), (_, q) in zip(model.named_parameters(), cpu.named_parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-5, rtol=1e-4, msg=n)


def test_static_cache_is_sharded_by_heads_and_compiled_decode_does_not_recompile(saved):
    from transformers import StaticCache

    from hf_tpu.runtime.buffers import executables

    ref, _ = saved["llama"]
    model = _load(saved, "llama")
    ids = zoo.inputs("llama")["input_ids"]
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(ids))
    expected = ref.generate(ids, cache_implementation="static", **kwargs)
    cache = StaticCache(config=model.config, max_cache_len=32)
    tpu_kwargs = {**kwargs, "attention_mask": kwargs["attention_mask"].to("tpu")}
    actual = model.generate(ids.to("tpu"), past_key_values=cache, **tpu_kwargs).cpu()
    assert torch.equal(actual, expected)
    assert hf_tpu.sharding(cache.layers[0].keys) == (None, "model", None, None)
    assert hf_tpu.sharding(cache.layers[0].values) == (None, "model", None, None)
    compiles = executables.stats["compiles"]
    again = model.generate(
        ids.to("tpu"), past_key_values=StaticCache(config=model.config, max_cache_len=32), **tpu_kwargs
    ).cpu()
    assert torch.equal(again, expected)
    assert executables.stats["compiles"] == compiles, "a second identical generate compiled something"


def test_sharded_forward_under_defer_and_fuse_is_one_program_equal_to_cpu(saved):
    from hf_tpu.runtime.launch import lazy

    ref, _ = saved["llama"]
    model = _load(saved, "llama")
    batch = zoo.inputs("llama")
    with torch.no_grad(), torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        flushes = lazy.stats["flushes"]
        logits = model(**zoo.on("tpu", batch)).logits
        torch.tpu.synchronize()
        assert lazy.stats["flushes"] - flushes == 1  # the whole forward fused into one SPMD program
    torch.testing.assert_close(logits.cpu(), ref(**batch).logits.detach(), atol=1e-5, rtol=1e-5)
    assert hf_tpu.sharding(model.lm_head.weight) == ("model", None)

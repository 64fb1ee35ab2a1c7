"""generate() paths beyond greedy/beam/sampling on tpu: user compile configs, cache implementations, ..."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, CompileConfig

from hf_tpu.runtime import native

NEW = 4


def _greedy(model, ids, **kwargs):
    kwargs.setdefault("do_sample", False)
    out = model.generate(
        ids.to(model.device),
        attention_mask=torch.ones_like(ids).to(model.device),
        **{"max_new_tokens": NEW, "min_new_tokens": NEW, **kwargs},
    )
    return out.cpu()


@pytest.mark.parametrize("options", [{"fullgraph": True}, {"dynamic": True}])
def test_user_compile_config_without_a_backend_compiles_with_tpu(llama_cpu, options):
    """`CompileConfig(...)` defaults to inductor, which cannot compile for tpu: on a tpu model the decode
    step compiles with the tpu backend instead of falling back to eager."""
    import torch._dynamo.utils as dynamo_utils

    model, path, ids = llama_cpu
    loaded = AutoModelForCausalLM.from_pretrained(path, device_map="tpu").eval()
    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    out = _greedy(loaded, ids, cache_implementation="static", compile_config=CompileConfig(**options))
    assert torch.equal(out, _greedy(model, ids))
    assert not getattr(loaded, "_hf_tpu_eager_decode", False)
    assert dynamo_utils.counters["stats"]["unique_graphs"] >= 1


@pytest.mark.parametrize("implementation", ["offloaded", "offloaded_static"])
def test_offloaded_cache_matches_cpu(llama_cpu, llama_tpu, implementation):
    """Upstream's offloading waits on `torch.cuda.default_stream` ("Torch not compiled with CUDA enabled"
    on tpu and CPU alike); on tpu it offloads every layer but the one running and the tokens are CPU's."""
    model, _, ids = llama_cpu
    out = llama_tpu.generate(
        ids.to("tpu"),
        attention_mask=torch.ones_like(ids).to("tpu"),
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        do_sample=False,
        cache_implementation=implementation,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences.cpu(), _greedy(model, ids))
    devices = [layer.keys.device.type for layer in out.past_key_values.layers]
    assert devices == ["tpu", "cpu"]  # the last layer ran last, and prefetched layer 0 back


def test_seeded_sampling_with_a_compiled_decode_step_matches_eager(llama_tpu, llama_cpu):
    """A static cache compiles the decode step; its attention draws no random key (dropout 0), so the
    sampled tokens for a seed are the eager decode's."""
    _, _, ids = llama_cpu

    def sample(**kwargs):
        torch.manual_seed(3)
        return _greedy(
            llama_tpu,
            ids,
            do_sample=True,
            top_k=20,
            max_new_tokens=8,
            cache_implementation="static",
            **kwargs,
        )

    assert torch.equal(sample(), sample(disable_compile=True))


@pytest.mark.parametrize("scheme", ["lefthash", "selfhash"])
def test_watermarked_generate_matches_cpu(llama_cpu, llama_tpu, scheme):
    """WatermarkLogitsProcessor seeds a `torch.Generator(device=...)`. With the C++ extension that is a
    real tpu generator drawing the device's permutations (as CUDA's differ from CPU's): the run is
    reproducible and every new token is in its context's greenlist. On the pure-Python path the generator
    is a CPU one, and the greenlists, hence the watermarked tokens, are CPU's."""
    from transformers import WatermarkingConfig, WatermarkLogitsProcessor

    model, _, ids = llama_cpu
    config = WatermarkingConfig(bias=5.0, seeding_scheme=scheme)
    out = _greedy(llama_tpu, ids, watermarking_config=config)
    if not native.active():
        assert torch.equal(out, _greedy(model, ids, watermarking_config=config))
        return
    assert torch.equal(out, _greedy(llama_tpu, ids, watermarking_config=config))
    if scheme == "lefthash":  # selfhash's greenlist also depends on the candidate token
        proc = WatermarkLogitsProcessor(
            vocab_size=model.config.vocab_size,
            device="tpu",
            greenlist_ratio=config.greenlist_ratio,
            bias=config.bias,
            hashing_key=config.hashing_key,
            seeding_scheme=scheme,
            context_width=config.context_width,
        )
        green = [
            int(out[0, i]) in set(proc._get_greenlist_ids(out[0, :i].to("tpu")).cpu().tolist())
            for i in range(ids.shape[1], out.shape[1])
        ]
        assert sum(green) >= NEW - 1, green


def test_synthid_watermark_processor_matches_cpu():
    from transformers import SynthIDTextWatermarkLogitsProcessor

    kwargs = dict(ngram_len=3, keys=[5, 9, 13], sampling_table_size=2**10, sampling_table_seed=0)
    kwargs["context_history_size"] = 16
    ids = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    scores = torch.randn(2, 128, generator=torch.Generator().manual_seed(1))
    cpu = SynthIDTextWatermarkLogitsProcessor(device="cpu", **kwargs)
    tpu = SynthIDTextWatermarkLogitsProcessor(device="tpu", **kwargs)
    assert tpu.keys.device.type == "tpu" and tpu.sampling_table.device.type == "tpu"
    if native.active():  # its sampling table comes from a real tpu generator: the device's draws (as on
        # CUDA), the same for the same seed; the rest of the processor must then match CPU's
        again = SynthIDTextWatermarkLogitsProcessor(device="tpu", **kwargs)
        assert torch.equal(again.sampling_table.cpu(), tpu.sampling_table.cpu())
        cpu.sampling_table = tpu.sampling_table.cpu()
    torch.testing.assert_close(tpu(ids.to("tpu"), scores.to("tpu")).cpu(), cpu(ids, scores))


def test_static_cache_generate_does_not_warn_of_a_compile_storm(llama_cpu, monkeypatch):
    """The deferred decode loop around a compiled step records `cat(input_ids, next_tokens)`, one new
    length per token by design; the DeferAndFuse compile-storm warning (advising a StaticCache the
    caller already uses) must not fire for it."""
    import warnings

    from hf_tpu.runtime.launch import lazy

    model, path, ids = llama_cpu
    loaded = AutoModelForCausalLM.from_pretrained(path, device_map="tpu").eval()
    monkeypatch.setitem(lazy._streak, "misses", 0)
    monkeypatch.setitem(lazy._streak, "warned", False)
    new = lazy._STORM_AT  # at least two flushes a token
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="hf_tpu DeferAndFuse.*each compiled")
        out = _greedy(loaded, ids[:1], cache_implementation="static", max_new_tokens=new, min_new_tokens=new)
    assert torch.equal(out, _greedy(model, ids[:1], max_new_tokens=new, min_new_tokens=new))


@pytest.mark.parametrize("returned", [False, True], ids=["cache_dropped", "cache_returned"])
def test_encoder_decoder_static_cache_generate_matches_cpu(returned):
    """T5 with a StaticCache: the decode step compiles with the tpu backend and the deferred stop check
    (on for tpu) rolls back only the self-attention cache; upstream's EncoderDecoderCache.crop refuses
    static caches, which made this raise on tpu."""
    import torch._dynamo.utils as dynamo_utils
    import transformers as tf

    torch.manual_seed(3)  # a seed whose greedy tokens vary (many random tiny T5s repeat one token)
    cfg = tf.T5Config(
        vocab_size=99,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        initializer_factor=8.0,
    )
    model = tf.T5ForConditionalGeneration(cfg).eval()
    ids = torch.randint(2, 99, (2, 7))
    kwargs = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, cache_implementation="static")
    ref = model.generate(ids, **kwargs)
    assert len(set(ref[:, 1:].flatten().tolist())) > 2
    on_tpu = model.to("tpu")
    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    out = on_tpu.generate(ids.to("tpu"), return_dict_in_generate=returned, **kwargs)
    tokens = out.sequences if returned else out
    assert torch.equal(tokens.cpu(), ref)
    assert dynamo_utils.counters["stats"]["unique_graphs"] >= 1
    if returned:
        assert out.past_key_values.get_seq_length() == ref.shape[1] - 1

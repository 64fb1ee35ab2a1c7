"""After from_pretrained(device_map="tpu"): forward, generate (greedy, sampling, beam, caches), save/reload."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, LogitsProcessor, LogitsProcessorList
from transformers.generation.streamers import BaseStreamer

from tests.integrations.conftest import all_on

NEW = 4


def _greedy(model, ids, **kwargs):
    out = model.generate(
        ids.to(model.device),
        attention_mask=torch.ones_like(ids).to(model.device),
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        do_sample=False,
        **kwargs,
    )
    return out.cpu()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_forward_matches_cpu(llama_cpu, attn):
    model, path, ids = llama_cpu
    loaded = AutoModelForCausalLM.from_pretrained(path, device_map="tpu", attn_implementation=attn)
    assert loaded.config._attn_implementation == attn
    with torch.no_grad():
        ref = model(ids).logits
        out = loaded(ids.to("tpu")).logits
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)


def test_greedy_tokens_identical_to_cpu(llama_cpu, llama_tpu):
    model, _, ids = llama_cpu
    assert torch.equal(_greedy(llama_tpu, ids), _greedy(model, ids))


def test_greedy_with_explicit_dynamic_cache(llama_cpu, llama_tpu):
    model, _, ids = llama_cpu
    cache = DynamicCache(config=llama_tpu.config)
    out = _greedy(llama_tpu, ids, cache=cache)
    assert cache.get_seq_length() == ids.shape[1] + NEW - 1
    assert cache.layers[0].keys.device.type == "tpu"
    assert torch.equal(out, _greedy(model, ids))


@pytest.mark.filterwarnings("ignore:hf_tpu DeferAndFuse.*each compiled")
def test_dynamic_cache_decode_under_defer_and_fuse_runs_new_lengths_op_by_op(llama_cpu, llama_tpu):
    """Under DeferAndFuse a DynamicCache decode step is the same trace at a new length every token: it
    runs op by op (only the kernels of the growing attention compile) instead of compiling a whole
    program per token, and the tokens are CPU's."""
    from hf_tpu.runtime.launch import lazy

    model, _, ids = llama_cpu
    expected = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    before = dict(lazy.stats)
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        out = llama_tpu.generate(ids.to("tpu"), max_new_tokens=8, min_new_tokens=8, do_sample=False).cpu()
    assert torch.equal(out, expected)
    assert lazy.stats["interpreted"] - before["interpreted"] >= 4


def test_sampling_with_a_seed_is_reproducible(llama_tpu, llama_cpu):
    _, _, ids = llama_cpu

    def sample(seed):
        torch.manual_seed(seed)
        out = llama_tpu.generate(
            ids.to("tpu"), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=True, top_k=20, top_p=0.9
        )
        return out.cpu()

    first, again, other = sample(7), sample(7), sample(8)
    assert torch.equal(first, again)
    assert first.shape == (2, ids.shape[1] + NEW)
    assert ((first[:, ids.shape[1] :] >= 0) & (first[:, ids.shape[1] :] < 128)).all()
    assert not torch.equal(first, other)  # the seed matters (2 x 4 tokens from top-20: a tie is ~1e-10)


class _Collect(BaseStreamer):
    def __init__(self) -> None:
        self.values: list = []

    def put(self, value) -> None:
        self.values.append(value.cpu().reshape(-1).tolist())

    def end(self) -> None:
        self.values.append("end")


class _ModeRecorder(LogitsProcessor):
    """Records the tpu eager mode the decode loop's own ops run in."""

    def __init__(self) -> None:
        self.modes: list = []

    def __call__(self, input_ids, scores):
        self.modes.append(torch.tpu.get_eager_mode())
        return scores


def test_tpu_decode_loop_reads_its_stop_flag_one_step_late():
    """transformers' DeferredStopCheck (upstream: mps only) is on for tpu, not for cpu."""
    import transformers.generation.utils as gen_utils

    assert gen_utils.DeferredStopCheck.is_supported(torch.device("tpu"), None, False, False)
    assert not gen_utils.DeferredStopCheck.is_supported(torch.device("tpu"), None, False, True)  # assistant
    assert not gen_utils.DeferredStopCheck.is_supported(torch.device("cpu"), None, False, False)


def test_eos_stop_streamer_and_returned_cache_match_cpu(llama_cpu, llama_tpu):
    """The deferred stop check runs one step past the EOS and undoes it: tokens, stream and cache as on CPU."""
    model, _, ids = llama_cpu
    ids = ids[:1]
    eos = int(_greedy(model, ids)[0, ids.shape[1] + 1])  # the second new token
    results = {}
    for name, m in (("cpu", model), ("tpu", llama_tpu)):
        streamer = _Collect()
        out = m.generate(
            ids.to(m.device),
            attention_mask=torch.ones_like(ids).to(m.device),
            max_new_tokens=NEW + 2,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
            streamer=streamer,
            return_dict_in_generate=True,
        )
        results[name] = (out.sequences.cpu(), streamer.values, out.past_key_values.get_seq_length())
    assert torch.equal(results["tpu"][0], results["cpu"][0])
    assert results["tpu"][0].shape[1] <= ids.shape[1] + 2  # it stopped at the EOS, before max_new_tokens
    assert results["tpu"][1] == results["cpu"][1]
    assert results["tpu"][2] == results["cpu"][2]


@pytest.mark.slow
def test_decode_loop_around_a_compiled_step_is_deferred_and_fused(llama_cpu):
    """StaticCache: the loop's eager ops run under DeferAndFuse (then Strict again); DynamicCache: Strict."""
    model, path, ids = llama_cpu
    llama_tpu = AutoModelForCausalLM.from_pretrained(path, device_map="tpu").eval()
    static, dynamic = _ModeRecorder(), _ModeRecorder()
    out = _greedy(
        llama_tpu, ids, cache_implementation="static", logits_processor=LogitsProcessorList([static])
    )
    assert torch.equal(out, _greedy(model, ids))
    assert torch.tpu.get_eager_mode() is torch.tpu.EagerMode.DEFER_NEVER
    assert static.modes[1:] and set(static.modes[1:]) == {torch.tpu.EagerMode.DEFER_AND_FUSE}  # [0]: prefill
    _greedy(llama_tpu, ids, logits_processor=LogitsProcessorList([dynamic]))
    assert set(dynamic.modes) == {torch.tpu.EagerMode.DEFER_NEVER}


@pytest.mark.slow
def test_beam_search_matches_cpu(llama_cpu, llama_tpu):
    model, _, ids = llama_cpu
    assert torch.equal(_greedy(llama_tpu, ids, num_beams=3), _greedy(model, ids, num_beams=3))


@pytest.mark.slow
def test_static_cache_compiled_decode_matches_cpu(llama_cpu, llama_tpu):
    """transformers auto-compiles the decode step on tpu (CompileConfig(backend="tpu")) for a static cache."""
    import torch._dynamo.utils as dynamo_utils

    model, _, ids = llama_cpu
    torch._dynamo.reset()  # another test may have compiled this forward already (Dynamo reuses it)
    dynamo_utils.counters.clear()
    out = _greedy(llama_tpu, ids, cache_implementation="static")
    assert torch.equal(out, _greedy(model, ids, cache_implementation="static"))
    assert dynamo_utils.counters["stats"]["unique_graphs"] >= 1  # the compiled path was taken
    assert not getattr(llama_tpu, "_hf_tpu_eager_decode", False)


@pytest.mark.slow
def test_compiled_decode_failure_degrades_to_eager_once(llama_cpu, caplog):
    """A backend that fails: generate still matches CPU, with one warning."""
    from transformers import CompileConfig

    def broken_backend(gm, example_inputs):
        raise NotImplementedError("this backend cannot compile anything")

    model, path, ids = llama_cpu
    loaded = AutoModelForCausalLM.from_pretrained(path, device_map="tpu")
    config = CompileConfig(backend=broken_backend, fullgraph=False)
    import hf_tpu.integrations.transformers as integ

    integ._compile_notice.clear()
    with caplog.at_level(logging.WARNING):
        out = _greedy(loaded, ids, cache_implementation="static", compile_config=config)
        again = _greedy(loaded, ids, cache_implementation="static", compile_config=config)
    assert torch.equal(out, _greedy(model, ids))
    assert torch.equal(again, out)
    notices = [r for r in caplog.records if "generating in eager mode" in r.getMessage()]
    assert len(notices) == 1


def test_save_pretrained_from_tpu_and_reload(llama_cpu, llama_tpu, tmp_path):
    model, _, ids = llama_cpu
    llama_tpu.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert all_on(reloaded, "cpu")
    for (name, p), q in zip(model.state_dict().items(), reloaded.state_dict().values()):
        assert torch.equal(p, q), name
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight
    on_tpu = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="tpu")
    assert on_tpu.lm_head.weight is on_tpu.model.embed_tokens.weight
    assert (
        on_tpu.lm_head.weight.untyped_storage().data_ptr()
        == on_tpu.model.embed_tokens.weight.untyped_storage().data_ptr()
    )


@pytest.mark.slow
def test_generate_calls_in_several_threads_match_cpu_and_leave_strict_mode(llama_cpu, llama_tpu):
    """The deferred decode loop is for a single thread using tpu tensors (the mode is process-wide): with
    two threads, whenever the second starts, the loops run (or go back to) Strict, and tokens stay CPU's."""
    import threading

    model, _, ids = llama_cpu
    expected = _greedy(model, ids)
    results, errors = [], []

    def run(delay):
        try:
            torch.tpu.synchronize()
            threading.Event().wait(delay)
            results.append(_greedy(llama_tpu, ids, cache_implementation="static"))
        except Exception as exc:  # noqa: BLE001 - asserted on below
            errors.append(repr(exc))

    _greedy(llama_tpu, ids, cache_implementation="static")  # compiled once: torch.compile is not thread-safe
    threads = [threading.Thread(target=run, args=(delay,)) for delay in (0.0, 0.05)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == 2 and all(torch.equal(r, expected) for r in results)
    assert torch.tpu.get_eager_mode() is torch.tpu.EagerMode.DEFER_NEVER

"""DeferAndFuse: deferred ops give Strict's results, fuse into cached programs, and sync where needed."""

import copy
import logging
import re

import numpy as np
import pytest
import torch

from hf_tpu.runtime.launch import lazy
from tests.hf_models import build, first_tensor


def test_ops_are_deferred_until_a_host_read(defer):
    x = torch.randn(4, 4)
    t = x.to("tpu")
    y = (t * 2 + 1).tanh()
    assert lazy.pending_ops() >= 3
    assert torch.allclose(y.cpu(), (x * 2 + 1).tanh())
    assert lazy.pending_ops() == 0
    z = y.sum()
    assert lazy.pending_ops() >= 1
    assert z.item() == pytest.approx(float((x * 2 + 1).tanh().sum()), rel=1e-5)
    assert lazy.pending_ops() == 0


def test_mutation_through_views_in_lazy_mode(defer):
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    t[0] = 1
    t.view(-1)[3] = 2
    t.t().mul_(2)
    t[:, ::2] += 5
    x[0] = 1
    x.view(-1)[3] = 2
    x.t().mul_(2)
    x[:, ::2] += 5
    torch.testing.assert_close(t.cpu(), x)


def test_repeated_step_reuses_the_compiled_program(defer):
    w = torch.randn(16, 16, device="tpu")

    def step(x):
        return torch.relu(x @ w).softmax(-1).sum(0)

    x = torch.randn(8, 16, device="tpu")
    torch.tpu.flush()  # the inputs' own creation is a different program
    step(x).cpu()
    before = dict(lazy.stats)
    for _ in range(3):
        step(x).cpu()
    assert lazy.stats["cache_misses"] == before["cache_misses"], "an identical step recompiled"
    assert lazy.stats["cache_hits"] >= before["cache_hits"] + 3


def test_debug_log_reports_each_flush(defer, caplog):
    """HF_TPU_LOG's per-flush line: why it flushed, ops, cache hit/miss and the compile time."""
    w = torch.randn(24, 24, device="tpu")
    torch.tpu.flush()
    with caplog.at_level(logging.DEBUG, logger="hf_tpu.lazy"):
        for _ in range(2):
            (torch.relu(w @ w) * 3.5).sum().item()
    lines = [r.getMessage() for r in caplog.records if r.name == "hf_tpu.lazy"]
    assert len(lines) == 2, lines
    pattern = r"flush \(value needed on host\): (\d+) ops, .*cache (hit|miss), compile ([\d.]+) ms, ([\d.]+) ms in all"
    first, second = (re.search(pattern, line) for line in lines)
    assert first and second, lines
    assert int(first.group(1)) >= 4 and first.group(1) == second.group(1)
    assert second.group(2) == "hit" and float(second.group(3)) == 0.0
    if first.group(2) == "miss":  # a program seen earlier in this process may be cached already
        assert 0.0 < float(first.group(3)) <= float(first.group(4))


def test_a_loop_that_never_syncs_is_cut_into_one_repeated_program(defer, monkeypatch):
    """Past half the graph-size limit a trace is cut after whole repetitions of its loop body, so every
    forced flush is the same program (one compile), not one program per starting point in the body."""
    monkeypatch.setattr(lazy, "MAX_OPS", 100)
    w = torch.randn(8, 8)
    x = torch.randn(4, 8)
    tw, tx = w.to("tpu"), x.to("tpu")
    torch.tpu.flush()
    before = dict(lazy.stats)
    outs = []
    for _ in range(100):  # 7 recorded ops per iteration, and 7 does not divide 100
        tx = (torch.tanh(tx @ tw) * 0.5 + tx).clamp(-3, 3) * 0.9
        outs.append(tx.sum())
        x = (torch.tanh(x @ w) * 0.5 + x).clamp(-3, 3) * 0.9
    flushes = lazy.stats["flushes"] - before["flushes"]
    misses = lazy.stats["cache_misses"] - before["cache_misses"]
    assert flushes >= 7, "the graph-size limit did not force flushes"
    # one program for the repeated cut (two if the first trace started mid-body); without the alignment
    # every forced flush compiles (7 of 7 here)
    assert misses <= 2, f"{misses} of {flushes} forced flushes compiled a new program"
    # 100 chained steps: fused (XLA) and CPU rounding drift apart by ~1e-4
    torch.testing.assert_close(tx.cpu(), x, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(outs[-1].cpu(), x.sum(), rtol=1e-3, atol=1e-2)


def test_views_that_move_every_step_reuse_one_program(defer):
    """A loop that reads `x[i * 8:(i + 1) * 8]` and writes `buf[:, i]` (a batch loader, a cache slot)
    moves its views' storage offsets every step. Offsets baked into the fused program would make every
    window of steps a new program; after a few distinct offsets they are traced, so windows repeat."""
    x = torch.randn(400, 16)
    w = torch.randn(16, 16)
    tx, tw = x.to("tpu"), w.to("tpu")
    tbuf = torch.zeros(4, 50, 16, device="tpu")
    torch.tpu.flush()
    misses = []
    for i in range(50):
        y = (tx[i * 8 : (i + 1) * 8] @ tw).relu()
        tbuf[:, i] = y[:4]
        if i % 5 == 4:
            before = lazy.stats["cache_misses"]
            y.sum().item()
            misses.append(lazy.stats["cache_misses"] - before)
    # the first windows compile while offsets are still baked; the rest reuse one program
    assert sum(misses[4:]) == 0, f"windows of identical steps compiled again: {misses}"
    ref = torch.zeros(4, 50, 16)
    for i in range(50):
        ref[:, i] = (x[i * 8 : (i + 1) * 8] @ w).relu()[:4]
    torch.testing.assert_close(tbuf.cpu(), ref)


def test_program_cache_keeps_the_most_recently_used(defer, monkeypatch):
    monkeypatch.setattr(lazy, "MAX_PROGRAMS", 3)
    t = torch.randn(5, device="tpu")
    torch.tpu.flush()
    for n in range(1, 7):  # six different programs
        assert (t * n + n).sum().item() == pytest.approx(float((t.cpu() * n + n).sum()), rel=1e-5)
    assert len(lazy._program_cache) <= 3


def test_a_new_program_every_step_warns_once(defer, monkeypatch):
    monkeypatch.setattr(lazy, "_streak", {"misses": 0, "warned": False})
    torch.tpu.flush()
    with pytest.warns(UserWarning, match="each compiled a new program") as record:
        for n in range(1, 30):  # a sequence that grows every step: a new shape each flush
            torch.ones(n, device="tpu").cumsum(0)[-1].item()
    storms = [w for w in record if "each compiled a new program" in str(w.message)]
    assert len(storms) == 1
    assert storms[0].filename == __file__, "the warning should point at the user's line"


def test_smallest_period():
    assert lazy._smallest_period([1, 2, 3, 1, 2, 3, 1]) == 3
    assert lazy._smallest_period([1, 1, 1]) == 1
    assert lazy._smallest_period([1, 2, 1, 3]) == 4
    assert lazy._smallest_period([]) == 0


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_hf_training_steps_match_cpu_under_defer_and_fuse(name, defer):
    """Backward kernels that leave a gradient undefined (layer/RMS norm's, attention's) record a None
    output: training an HF model under DeferAndFuse matches CPU."""
    torch.manual_seed(0)
    ref, inputs = build(name)
    ref.train()
    for mod in ref.modules():  # deterministic steps: no dropout
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
    dev = copy.deepcopy(ref).to("tpu")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, dev)]  # AdamW turns noise into steps
    for _ in range(2):
        for model, opt, device in ((ref, opts[0], "cpu"), (dev, opts[1], "tpu")):
            out = model(**{k: v.to(device) for k, v in inputs.items()})
            first_tensor(out).float().square().mean().backward()
            opt.step()
            opt.zero_grad()
    for (n, p), (_, q) in zip(ref.named_parameters(), dev.named_parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-4, msg=n)


def test_training_step_matches_strict():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    x, y = torch.randn(5, 8), torch.randn(5, 2)

    def train(mode):
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
        m.load_state_dict(model.state_dict())
        m.to("tpu")
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        torch.tpu.set_eager_mode(mode)
        try:
            for _ in range(2):
                opt.zero_grad()
                torch.nn.functional.mse_loss(m(x.to("tpu")), y.to("tpu")).backward()
                opt.step()
            return [p.detach().cpu() for p in m.parameters()]
        finally:
            torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)

    for a, b in zip(train(torch.tpu.EagerMode.DEFER_AND_FUSE), train(torch.tpu.EagerMode.DEFER_NEVER)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama", "bert", "gpt2"])
def test_hf_models_match_cpu_under_defer_and_fuse(name, defer):
    model, inputs = build(name)
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
    with torch.no_grad():
        ref = first_tensor(model(**inputs))
        model.to("tpu")
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
        out = first_tensor(model(**{k: v.to("tpu") for k, v in inputs.items()}))
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)


def test_mode_selection_api():
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        assert torch.tpu.get_eager_mode() is torch.tpu.EagerMode.DEFER_AND_FUSE
        t = torch.ones(3, device="tpu") * 3
        assert lazy.pending_ops() >= 1
        torch.tpu.flush()
        assert lazy.pending_ops() == 0
        assert t.cpu().tolist() == [3.0, 3.0, 3.0]
    assert torch.tpu.get_eager_mode() is torch.tpu.EagerMode.DEFER_NEVER


def test_defer_and_fuse_peak_memory_is_lower_than_strict():
    """Intermediates that die before the flush never get a buffer, so they never count as allocated."""
    x = torch.randn(256, 1024, device="tpu")  # 1 MiB

    def chain():
        y = x
        for _ in range(8):
            y = torch.tanh(y * 1.5 + 0.25)
        return y

    def peak(mode) -> tuple[int, torch.Tensor]:
        with torch.tpu.eager_mode(mode):
            torch.tpu.synchronize()
            base = torch.tpu.memory_allocated()
            torch.tpu.reset_peak_memory_stats()
            out = chain()
            torch.tpu.synchronize()
            return torch.tpu.max_memory_allocated() - base, out

    strict_peak, strict_out = peak(torch.tpu.EagerMode.DEFER_NEVER)
    fused_peak, fused_out = peak(torch.tpu.EagerMode.DEFER_AND_FUSE)
    torch.testing.assert_close(fused_out.cpu(), strict_out.cpu())
    assert fused_peak <= 1 << 20 < strict_peak, (fused_peak, strict_peak)


def _failing_exp(fail_times: list):
    """An `exp` kernel whose lowering fails at run time (a host callback raising, as an execution error
    would): fails while `fail_times[0]` > 0, counting down."""
    import jax

    from hf_tpu.runtime.execution import dispatch
    from hf_tpu.runtime.lowerings.table import Lowering, resolve

    def host_exp(a):
        if fail_times[0] > 0:
            fail_times[0] -= 1
            raise ValueError("boom at run time")
        return np.exp(a)

    def lowering(x):
        return jax.pure_callback(host_exp, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    return dispatch.OpKernel(resolve("aten::exp"), Lowering(lowering))


def test_a_failed_flush_names_the_op_and_keeps_the_other_values(defer):
    """An op that fails when its trace runs: the flush raises naming it; values not computed from it
    (an optimizer-like in-place update recorded before, a product recorded after) keep theirs; values
    computed from it raise instead of reading garbage; the mode goes on working."""
    w_cpu = torch.randn(3, 3)
    p_cpu = torch.randn(3)
    w, param = w_cpu.to("tpu"), p_cpu.to("tpu")
    for _ in range(2):  # `x + 1` at this shape is cached: the C++ recorder would record it natively
        (w + 1).cpu()
    torch.tpu.flush()
    param.add_(1)
    failed = _failing_exp([10**9])(w)
    from_failed = failed * 2
    after = w * 3
    with pytest.raises(
        RuntimeError, match=r"aten\.exp\.default, recorded under DeferAndFuse .*boom at run time"
    ):
        torch.tpu.synchronize()
    torch.testing.assert_close(param.cpu(), p_cpu + 1)
    torch.testing.assert_close(after.cpu(), w_cpu * 3)
    for lost in (failed, from_failed):
        with pytest.raises(lazy.LostValueError, match="computed from aten.exp.default, which failed"):
            lost.cpu()
    with pytest.raises(RuntimeError, match=r"aten\.add\.Tensor failed .*computed from aten\.exp\.default"):
        from_failed + 1
    torch.testing.assert_close((param * w).sum(0).cpu(), ((p_cpu + 1) * w_cpu).sum(0))
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)  # Strict names the lost input too
    with pytest.raises(RuntimeError, match=r"aten\.mul\.Tensor failed .*computed from aten\.exp\.default"):
        from_failed * 2


def test_a_fused_program_that_fails_where_its_ops_do_not_runs_op_by_op(defer):
    """The fused program failing where its ops one by one succeed (out of memory on a chip: the ops
    alone need less at once) completes the flush op by op, warns once, and runs that trace op by op
    from then on."""
    w_cpu = torch.randn(4, 4)
    w = w_cpu.to("tpu")
    fail_times = [1]
    kernel = _failing_exp(fail_times)
    torch.tpu.flush()
    before = lazy.stats["interpreted"]
    with pytest.warns(UserWarning, match="its ops ran one by one instead"):
        got = (kernel(w) + 1).cpu()
    torch.testing.assert_close(got, w_cpu.exp() + 1)
    got = (kernel(w) + 1).cpu()  # the same trace again: op by op, no new failure
    torch.testing.assert_close(got, w_cpu.exp() + 1)
    assert lazy.stats["interpreted"] == before + 1


@pytest.mark.filterwarnings("ignore:hf_tpu DeferAndFuse.*each compiled")  # a new length every step
def test_new_shapes_of_a_known_trace_run_op_by_op_before_compiling(defer):
    """A decode-like loop: a step of many ops whose few growing ones change shape every time. After
    the first program, each new length runs op by op (only the growing kernels compile); the second
    time a length comes back its trace compiles, and the third time it is a cache hit."""
    torch.manual_seed(0)
    layers = [torch.randn(16, 16) / 4 for _ in range(24)]
    tl = [w.to("tpu") for w in layers]

    def step(h, cache, dev_layers):
        for w in dev_layers:  # 72 ops on constant shapes
            h = torch.tanh(h @ w) + h
        cache = torch.cat([cache, h], 0)  # grows one row per step
        return h, cache, (cache @ h.t()).softmax(0).sum()

    def run(dev_layers, h, cache, steps):
        out = []
        for _ in range(steps):
            h, cache, s = step(h, cache, dev_layers)
            out.append(s.item())
        return out

    h0, c0 = torch.randn(1, 16), torch.randn(2, 16)
    expected = run(layers, h0, c0, 6)
    counts = []
    for _ in range(3):
        before = dict(lazy.stats)
        got = run(tl, h0.to("tpu"), c0.to("tpu"), 6)
        assert got == pytest.approx(expected, rel=1e-4)
        counts.append({k: lazy.stats[k] - before[k] for k in ("interpreted", "cache_misses", "cache_hits")})
    first, second, third = counts
    assert first["interpreted"] >= 4, counts  # every length after the first programs of this wiring
    assert second["interpreted"] == 0 and second["cache_misses"] >= first["interpreted"], counts
    assert third == {"interpreted": 0, "cache_misses": 0, "cache_hits": 6}, counts


def _live_mib() -> float:
    """MiB of live JAX arrays, once dead tensors' payloads are dropped."""
    import gc

    import jax

    from hf_tpu.runtime.buffers.storage import REGISTRY

    gc.collect()
    REGISTRY.sweep()
    return sum(a.nbytes for a in jax.live_arrays()) / 2**20


def test_a_lost_tensor_does_not_keep_its_failed_trace_alive(defer, monkeypatch):
    """Values lost in a failed flush stay in their payloads (a gradient in `.grad`): they must not hold
    the failed trace's intermediates (they keep the failed op's name, not the error, whose traceback
    holds them). A storage the trace overwrote from the failed op gets its earlier array back."""
    # the failing kernel's host callback logs its error, and pytest keeps log records: their tracebacks
    # hold the flush's frames
    monkeypatch.setattr(logging.getLogger("jax._src.callback"), "disabled", True)
    w = torch.randn(256, 1024, device="tpu")  # 1 MiB
    state = torch.randn(256, 1024, device="tpu")
    state_before = state.cpu()
    torch.tpu.flush()
    base = _live_mib()
    h = w
    for _ in range(16):  # 32 MiB of intermediates
        h = torch.tanh(h * 1.5 + 0.25)
    bad = _failing_exp([10**9])(torch.ones(2, device="tpu")).sum()
    lost = h * bad
    state.mul_(bad)
    del h, bad
    with pytest.raises(RuntimeError, match=r"aten\.exp\.default"):
        torch.tpu.synchronize()
    with pytest.raises(lazy.LostValueError, match="computed from aten.exp.default"):
        lost.cpu()
    assert torch.equal(state.cpu(), state_before)  # overwritten from the failed op: restored
    assert _live_mib() - base < 0.5  # no intermediate of the failed trace is left


def test_op_by_op_drops_intermediates_after_their_last_read(defer, monkeypatch):
    """A trace run op by op holds each intermediate only until its last reader ran, as Strict does."""
    import jax

    monkeypatch.setattr(lazy, "_interpret_first", lambda *args: True)
    peak = [0.0]

    def probe(x):  # records the live arrays when it runs op by op (not when traced)
        if not isinstance(x, jax.core.Tracer):
            peak[0] = _live_mib()
        return x

    w = torch.randn(256, 1024, device="tpu")  # 1 MiB
    torch.tpu.flush()
    base = _live_mib()
    h = w
    for _ in range(24):
        h = torch.tanh(h * 1.5 + 0.25)
    before = lazy.stats["interpreted"]
    out = lazy.call(probe, (torch.tpu_to_jax(h) if hasattr(torch, "tpu_to_jax") else _lazy_array(h),))
    lazy.flush()
    assert lazy.stats["interpreted"] == before + 1
    assert out.concrete is not None
    assert peak[0] - base < 8, peak  # 72 MiB of intermediates when every one is held


def _lazy_array(t):
    from hf_tpu.runtime.tensors.tensor import to_jax_lazy

    return to_jax_lazy(t)


def test_a_trace_run_op_by_op_for_good_is_not_a_compile_storm(defer, monkeypatch):
    """A trace whose fused program failed runs op by op every time after; once its kernels compiled,
    those flushes compile nothing and do not count toward the compile-storm warning."""
    import warnings

    monkeypatch.setitem(lazy._streak, "misses", 0)
    monkeypatch.setitem(lazy._streak, "warned", False)
    w = torch.randn(4, 4, device="tpu")
    kernel = _failing_exp([1])
    torch.tpu.flush()
    with pytest.warns(UserWarning, match="its ops ran one by one instead"):
        (kernel(w) + 1).cpu()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="hf_tpu DeferAndFuse.*each compiled")
        for _ in range(lazy._STORM_AT + 2):
            (kernel(w) + 1).cpu()


def test_a_failed_training_step_leaves_the_parameters_as_they_were(defer):
    """An out-of-memory-style failure in the loss: the recorded backward and optimizer step could not be
    computed, so the parameters they overwrote get back their values from before the step (as in
    Strict, where the step never ran) and a retry starts from intact weights."""
    torch.manual_seed(0)
    cpu = torch.nn.Linear(4, 4)
    lin = copy.deepcopy(cpu).to("tpu")
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    x_cpu = torch.randn(2, 4)
    x = x_cpu.to("tpu")
    torch.tpu.flush()
    kernel = _failing_exp([10**9])
    h = lin(x)
    (h * kernel(h.detach())).sum().backward()
    # the optimizer step ends the trace (lazy._flush_at_optimizer_steps): the failure surfaces there
    with pytest.raises(
        RuntimeError, match=r"aten\.exp\.default.*flush \(optimizer step\).* 2 tensor\(s\) .* keep"
    ):
        opt.step()
    torch.tpu.synchronize()
    torch.testing.assert_close(lin.weight.detach().cpu(), cpu.weight.detach())
    torch.testing.assert_close(lin.bias.detach().cpu(), cpu.bias.detach())
    torch.testing.assert_close(lin(x).cpu(), cpu(x_cpu))


def test_each_optimizer_step_is_one_cached_program(defer, monkeypatch):
    """A training loop that never syncs: every trace ends where `optimizer.step()` ends, so the steps
    after the first two (the first also creates AdamW's state) reuse one program. Cut by the graph-size
    limit alone, each trace would start elsewhere in the step and compile anew."""
    # a step (45 ops; 61 the first) over half the limit: the limit's own alignment to a repeating
    # sequence needs two repetitions by then, so only the step boundary keeps the traces alike
    monkeypatch.setattr(lazy, "MAX_OPS", 80)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    x, y = torch.randn(5, 8), torch.randn(5, 2)
    model = copy.deepcopy(ref).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=False)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01, foreach=False)
    xt, yt = x.to("tpu"), y.to("tpu")
    torch.tpu.flush()
    per_step = []
    for _ in range(14):
        before = dict(lazy.stats)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xt), yt).backward()
        opt.step()
        per_step.append({k: lazy.stats[k] - before[k] for k in ("flushes", "cache_misses", "ops")})
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    assert all(s["flushes"] == 1 for s in per_step), per_step  # the step's own, nothing else
    assert all(lazy.MAX_OPS // 2 < s["ops"] < lazy.MAX_OPS for s in per_step), per_step
    # AdamW's per-step scalars (step size, bias corrections) are baked into their kernels until a kernel
    # has seen 4 values (dispatch._MAX_STATIC_SCALAR_BUILDS_DEFERRED, one a step): from then on, hits
    assert sum(s["cache_misses"] for s in per_step[6:]) == 0, per_step
    for p, q in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5)

"""torch.compile(backend="tpu"): correct numerics, cache hits, graph breaks, training steps."""

import pytest
import torch

from hf_tpu.runtime import compile as tpu_compile
from tests.hf_models import build, first_tensor


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_compiled_model_matches_cpu_and_hits_cache(name):
    model, inputs = build(name)
    with torch.no_grad():
        ref = first_tensor(model(**inputs))
        model.to("tpu")
        compiled = torch.compile(model, backend="tpu")
        dev_inputs = {k: v.to("tpu") for k, v in inputs.items()}
        out = first_tensor(compiled(**dev_inputs))
        graphs_after_first = tpu_compile._counter[0]
        out2 = first_tensor(compiled(**dev_inputs))
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out2.cpu(), ref, atol=1e-5, rtol=1e-5)
    assert tpu_compile._counter[0] == graphs_after_first, "second identical call recompiled"


def test_graph_break_is_still_correct():
    def f(x):
        y = torch.sin(x) * 2
        print("graph break")  # forces a break
        return (y @ y.T).relu().sum(-1)

    x = torch.randn(8, 8)
    out = torch.compile(f, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), f(x), atol=1e-5, rtol=1e-5)


def test_compiled_training_step_equals_eager():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    dev = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    dev.load_state_dict(ref.state_dict())
    dev.to("tpu")
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    step = torch.compile(lambda m, a, b: torch.nn.functional.mse_loss(m(a), b), backend="tpu")
    loss_ref = torch.nn.functional.mse_loss(ref(x), y)
    loss_ref.backward()
    loss = step(dev, x.to("tpu"), y.to("tpu"))
    loss.backward()
    torch.testing.assert_close(loss.cpu(), loss_ref.detach(), atol=1e-5, rtol=1e-5)
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.grad.cpu(), p_ref.grad, atol=1e-5, rtol=1e-5)


def test_backend_accepts_transformers_kwargs():
    f = torch.compile(
        lambda x: x * 2 + 1, backend="tpu", mode="reduce-overhead", dynamic=False, fullgraph=True
    )
    assert f(torch.ones(3, device="tpu")).cpu().tolist() == [3.0, 3.0, 3.0]


def test_bucketing_pads_to_few_shapes_and_matches():
    import hf_tpu

    model, _ = build("bert")
    with torch.no_grad():
        model.to("tpu")
        bucketed = hf_tpu.compile(model, buckets=(8, 16))
        before = None
        for length in (5, 7, 8, 11, 16):
            ids = torch.randint(0, 256, (2, length))
            mask = torch.ones_like(ids)
            out = bucketed(input_ids=ids.to("tpu"), attention_mask=mask.to("tpu")).last_hidden_state
            model_cpu = build("bert")[0]
            ref = model_cpu(input_ids=ids, attention_mask=mask).last_hidden_state
            assert out.shape == ref.shape
            torch.testing.assert_close(out.cpu(), ref, atol=1e-4, rtol=1e-4)
            if length == 8:
                before = tpu_compile._counter[0]
        # lengths 11 and 16 share the 16 bucket: at most one more compile after the 8-bucket
        assert tpu_compile._counter[0] <= before + 1
        with pytest.raises(ValueError, match="exceeds the largest bucket 16"):
            bucketed(input_ids=torch.zeros(1, 20, dtype=torch.long, device="tpu"))

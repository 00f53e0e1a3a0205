"""torch.pjrt.graph / torch.pjrt.Graph: CUDA graphs' contract on pjrt. A captured region
replays as one program on new contents of its static tensors, records no op and runs one
execution per replay; values against CPU PyTorch; what cannot be captured says why."""

from __future__ import annotations

import copy

import pytest
import torch

import torch_pjrt

DEVICE = torch_pjrt.DEVICE_NAME
dev = getattr(torch, DEVICE)


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _counts() -> tuple[int, int]:
    m = torch_pjrt.metrics()
    return m["ops_recorded"], m["executions"]


def test_a_captured_forward_replays_on_new_inputs_like_cpu() -> None:
    cpu = _net()
    model = copy.deepcopy(cpu).to(DEVICE)
    static_in = torch.randn(3, 8).to(DEVICE)
    g = dev.Graph()
    with torch.no_grad(), dev.graph(g):
        assert dev.is_current_stream_capturing()
        static_out = model(static_in) * 2
    assert not dev.is_current_stream_capturing()
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        batch = torch.randn(3, 8, generator=gen)
        static_in.copy_(batch.to(DEVICE))
        dev.synchronize()
        ops, runs = _counts()
        g.replay()
        dev.synchronize()
        assert _counts() == (ops, runs + 1)  # no op recorded: one program ran
        with torch.no_grad():
            torch.testing.assert_close(static_out.cpu(), cpu(batch) * 2)
    assert g.replays == 3


def test_tensors_made_after_others_died_in_the_region_are_static_too() -> None:
    x = torch.ones(4, device=DEVICE)
    g = dev.Graph()
    kept = []
    with torch.no_grad(), dev.graph(g):
        for i in range(200):
            t = x * float(i)  # freed at the next iteration: Python reuses its id for a later tensor
            if i % 20 == 0:
                kept.append(x + float(i))
    x.fill_(2)
    g.replay()
    assert [k.cpu().tolist() for k in kept] == [[2.0 + i] * 4 for i in range(0, 200, 20)]
    del t


def test_a_captured_training_step_replays_every_step_like_cpu() -> None:
    cpu = _net()
    model = copy.deepcopy(cpu).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)  # as CUDA graphs ask: state on the device
    ref_opt = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(2)
    batches = [(torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)) for _ in range(4)]
    static_x, static_y = batches[0][0].to(DEVICE), batches[0][1].to(DEVICE)

    def step(m: torch.nn.Module, o: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        o.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        o.step()
        return loss

    step(model, opt, static_x, static_y)  # warm-up (CUDA graphs ask for one too): gradients and state exist
    step(cpu, ref_opt, *batches[0])
    g = dev.Graph()
    with dev.graph(g):
        static_loss = step(model, opt, static_x, static_y)  # the capture runs the step (on batch 0 again)
    ref_loss = step(cpu, ref_opt, *batches[0])
    torch.testing.assert_close(static_loss.cpu(), ref_loss.detach())
    for x, y in batches[1:]:
        static_x.copy_(x.to(DEVICE))
        static_y.copy_(y.to(DEVICE))
        g.replay()
        ref_loss = step(cpu, ref_opt, x, y)
        torch.testing.assert_close(static_loss.cpu(), ref_loss.detach())
        for (name, p), q in zip(model.named_parameters(), cpu.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, msg=lambda m: f"grad {name}: {m}")
            torch.testing.assert_close(p.detach().cpu(), q.detach(), msg=lambda m: f"param {name}: {m}")


def test_a_cpu_step_count_in_the_region_is_refused() -> None:
    model = _net().to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # not capturable: its step count is a CPU tensor
    x = torch.randn(4, 8).to(DEVICE)
    model(x).sum().backward()
    opt.step()
    g = dev.Graph()
    with pytest.raises(RuntimeError, match="capturable=True"):
        with dev.graph(g):
            model(x).sum().backward()
            opt.step()


def test_random_ops_draw_anew_at_each_replay() -> None:
    static_in = torch.ones(4096, device=DEVICE)
    g = dev.Graph()
    with dev.graph(g):
        out = torch.nn.functional.dropout(static_in, p=0.5, training=True)
    masks = [out.cpu() != 0]
    for _ in range(2):
        g.replay()
        masks.append(out.cpu() != 0)
    for a, b in zip(masks, masks[1:]):
        assert not torch.equal(a, b)  # the generator's state advances, as under CUDA graphs
    kept = torch.stack(masks).double().mean().item()
    assert 0.45 < kept < 0.55, kept  # 3 x 4096 Bernoulli(0.5) draws: 0.5 +- 0.024 at 5 sigma
    assert torch.all((out == 0) | (out == 2)).item()


def test_a_host_read_in_the_region_is_refused_with_its_cause() -> None:
    x = torch.randn(4, device=DEVICE)
    g = dev.Graph()
    with pytest.raises(RuntimeError, match="not one device program"):
        with dev.graph(g):
            y = x * 2
            float(y.sum())  # a host read
    assert not dev.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="not been captured"):
        g.replay()
    g.reset()  # and the device still captures
    with dev.graph(g):
        z = x + 1
    x.copy_(torch.zeros(4).to(DEVICE))
    g.replay()
    torch.testing.assert_close(z.cpu(), torch.ones(4))


def test_an_exception_in_the_region_ends_the_capture() -> None:
    g = dev.Graph()
    with pytest.raises(ValueError, match="inside"):
        with dev.graph(g):
            raise ValueError("inside")
    assert not dev.is_current_stream_capturing()
    assert (torch.ones(2, device=DEVICE) + 1).cpu().tolist() == [2.0, 2.0]


def test_a_graph_is_captured_once() -> None:
    g = dev.Graph()
    x = torch.ones(2, device=DEVICE)
    with dev.graph(g):
        x.add_(1)
    with pytest.raises(RuntimeError, match="already captured"):
        with dev.graph(g):
            x.add_(1)
    g.replay()
    assert x.cpu().tolist() == [3.0, 3.0]  # the capture ran once, the replay once: in place


def test_pools_are_accepted_as_on_cuda() -> None:
    pool = dev.MemPool()
    assert isinstance(pool.id, tuple) and len(pool.id) == 2
    handle = dev.graph_pool_handle()
    assert handle != pool.id
    x = torch.ones(3, device=DEVICE)
    with dev.use_mem_pool(pool):
        g = dev.Graph()
        with dev.graph(g, pool=pool.id):
            y = x * 3
    assert g.pool() == pool.id
    x.fill_(2)
    g.replay()
    assert y.cpu().tolist() == [6.0, 6.0, 6.0]
    with pytest.raises(ValueError, match="allocator"):
        dev.MemPool(allocator=object())
    with pytest.raises(TypeError, match="MemPool"):
        with dev.use_mem_pool("pool"):
            pass


def test_a_weight_replaced_after_capture_does_not_break_the_replay() -> None:
    model = _net().to(DEVICE)
    x = torch.randn(2, 8).to(DEVICE)
    g = dev.Graph()
    with torch.no_grad(), dev.graph(g):
        out = model(x)
    expected = out.cpu()
    model.to("cpu").to(DEVICE)  # every parameter gets a new storage (param.data = ...)
    g.replay()  # the program keeps the storages it was captured with, as a CUDA graph keeps its addresses
    torch.testing.assert_close(out.cpu(), expected)


def test_transformers_continuous_batching_replays_device_graphs_and_equals_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = pytest.importorskip("transformers")
    import serving_models  # tests/python on sys.path via conftest

    torch.manual_seed(0)
    tokenizer = serving_models._tokenizer()
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=256, initializer_range=serving_models.INIT_RANGE,
                                      eos_token_id=0, pad_token_id=1)
    model = transformers.LlamaForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, len(tokenizer), (int(n),), generator=gen).tolist() for n in (5, 9, 17, 3)]
    generation = transformers.GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=1)

    def run(graphs: bool) -> dict[str, list[int]]:
        # The paged cache sized explicitly: on the CPU plugin the device's memory is the host's.
        batching = transformers.ContinuousBatchingConfig(num_blocks=16, page_size=16, max_batch_tokens=64,
                                                         use_cuda_graph=graphs)
        out = model.generate_batch(prompts, generation_config=generation, continuous_batching_config=batching)
        return {k: v.generated_tokens for k, v in out.items()}

    expected = run(False)
    model.to(DEVICE)
    replays = []
    original = dev.Graph.replay
    monkeypatch.setattr(dev.Graph, "replay", lambda self: (replays.append(self), original(self))[1])
    with torch_pjrt.fallback_mode("error"):
        got = run(True)
    assert got == expected
    assert len(replays) >= 4, len(replays)  # the decode steps ran as replays of captured programs

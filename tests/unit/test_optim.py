"""AdamW's kernel per device: fused on a GPU, foreach on CPU; each computes the same update as the other (checked
here on CPU, where torch has both), so the GPU's choice changes speed, never the weights."""

import copy

import torch

from relayrl.learner.optim import adamw_kernel, build_optimizer


def test_a_gpu_takes_the_fused_kernel_and_a_cpu_foreach():
    assert adamw_kernel("cuda") == {"fused": True}
    assert adamw_kernel("cpu") == {"foreach": True}
    optimizer = build_optimizer(torch.nn.Linear(4, 4), lr=1e-3, weight_decay=0.01, betas=(0.9, 0.99))
    assert optimizer.defaults["foreach"] is True and not optimizer.defaults["fused"]


def test_the_fused_and_foreach_kernels_take_the_same_steps():
    torch.manual_seed(0)
    start = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    inputs, targets = torch.randn(64, 16), torch.randn(64, 8)
    weights = []
    for kernel in ({"fused": True}, {"foreach": True}):
        model = copy.deepcopy(start)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, betas=(0.9, 0.99), **kernel)
        for _ in range(5):
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert not torch.equal(weights[0], torch.cat([p.detach().flatten() for p in start.parameters()]))
    torch.testing.assert_close(weights[0], weights[1], rtol=1e-5, atol=1e-5)

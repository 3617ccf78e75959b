"""A function compiled ahead of time (torch.export + AOTInductor): ``swkv_teach.ahead_of_time.AheadOfTime``.

The expectation is always the same function run eagerly. The function here is small (a linear layer and an
in-place write into a buffer it is given), so one compilation takes seconds; it is made once for the file.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swkv_teach.ahead_of_time import AheadOfTime


def step(module: nn.Module, x: torch.Tensor, bufs: list[torch.Tensor]) -> torch.Tensor:
    """Writes ``x``'s row sums into slot 1 of every buffer (in place), returns ``module(x)``."""
    for b in bufs:
        b.index_copy_(0, torch.tensor([1]), x.sum(-1, keepdim=True).T)
    return module(x)


def inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 4, generator=g), [torch.zeros(3, 2), torch.zeros(3, 2)]


@pytest.fixture(scope="module")
def compiled():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 3)).eval()
    aot = AheadOfTime(step)
    x, bufs = inputs(0)
    with torch.inference_mode():
        aot(module, x, bufs)  # compiles (seconds)
    return module, aot, x, bufs


@pytest.mark.slow
def test_it_computes_what_the_function_computes_and_writes_its_inputs_in_place(compiled):
    """New values in the same tensors, then new tensors of the same kind: outputs and in-place writes as eager."""
    module, aot, x, bufs = compiled
    with torch.inference_mode():
        for seed in (1, 2):
            new_x, _ = inputs(seed)
            x.copy_(new_x)
            want_bufs = [b.clone() for b in bufs]
            want = step(module, x, want_bufs)
            got = aot(module, x, bufs)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
            for b, w in zip(bufs, want_bufs):
                assert torch.equal(b, w), "the buffers were not written in place as the function writes them"
        other_x, other_bufs = inputs(3)  # other tensors, same shapes: checked once, then run
        want_bufs = [b.clone() for b in other_bufs]
        torch.testing.assert_close(aot(module, other_x, other_bufs), step(module, other_x, want_bufs),
                                   rtol=0, atol=1e-6)
        assert all(torch.equal(b, w) for b, w in zip(other_bufs, want_bufs))


@pytest.mark.slow
@pytest.mark.parametrize("bad, match", [
    (lambda x, bufs: (torch.randn(5, 4), bufs), r"input 0 .* shape \(2, 4\).*got shape \(5, 4\)"),
    (lambda x, bufs: (x.double(), bufs), r"input 0 .*torch.float32.*got .*torch.float64"),
    (lambda x, bufs: (x.T.contiguous().T, bufs), r"input 0 .*strides \(4, 1\).*got .*strides \(1, 2\)"),
    (lambda x, bufs: (x, [bufs[0]]), r"must be the 3 tensors .* got 2"),
    (lambda x, bufs: (x, [bufs[0], torch.zeros(4, 2)]), r"input 2 .* shape \(3, 2\).*got shape \(4, 2\)"),
    (lambda x, bufs: (x, [bufs[0], 7]), r"input 2 .*got int"),
])
def test_inputs_of_another_kind_are_refused_and_nothing_runs(compiled, bad, match):
    """The library reads whatever memory it is given, so other shapes, strides, dtypes or counts are refused
    before it runs, naming the input, what it was compiled for and what came; the buffers stay as they were,
    and the next right call still works."""
    module, aot, x, bufs = compiled
    before = [b.clone() for b in bufs]
    with torch.inference_mode():
        with pytest.raises(ValueError, match=match):
            aot(module, *bad(x, bufs))
        assert all(torch.equal(b, w) for b, w in zip(bufs, before)), "a refused call wrote the buffers"
        torch.testing.assert_close(aot(module, x, bufs), module(x), rtol=0, atol=1e-6)


@pytest.mark.slow
def test_it_reads_the_modules_own_weights_and_knows_when_they_were_replaced(compiled):
    """Weights changed in place are read at the next call (no copy was packed); a parameter replaced by another
    tensor makes ``current`` False, and after ``reset`` the next call compiles again and reads the new one."""
    module, aot, x, bufs = compiled
    with torch.no_grad():
        module[2].weight.mul_(-2.0)
    with torch.inference_mode():
        torch.testing.assert_close(aot(module, x, bufs), module(x), rtol=0, atol=1e-6)
    assert aot.current(module)
    module[2].weight = nn.Parameter(module[2].weight.detach() * 3.0)  # a new tensor (an ordinary one: export's)
    assert not aot.current(module), "a replaced parameter was not noticed"
    aot.reset()
    assert not aot.compiled
    with torch.inference_mode():
        torch.testing.assert_close(aot(module, x, bufs), module(x), rtol=0, atol=1e-6)
    assert aot.compiled and aot.current(module)


@pytest.mark.slow
def test_a_swapped_data_or_another_module_is_noticed_and_never_read_freed(compiled):
    """``.data`` swapped (what ``.double()`` then ``.float()`` does) keeps the Parameter object but moves its
    memory: ``current`` says so; the old memory stays alive (the library would read old weights, not freed
    memory). Another module is refused outright, the object left as it was."""
    module, aot, x, bufs = compiled
    with torch.inference_mode():
        aot(module, x, bufs)  # compiled for these weights (a fresh library if an earlier test reset it)
    assert aot.current(module)
    other = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 3)).eval()
    with torch.inference_mode(), pytest.raises(ValueError, match="module must be the Sequential this step was "
                                                                  "compiled for .* got another Sequential"):
        aot(other, x, bufs)
    assert not aot.current(other) and aot.current(module)
    param = module[0].weight
    module.double()
    module.float()
    assert module[0].weight is param, "the round trip keeps the Parameter object (the case an `is` test misses)"
    assert not aot.current(module), "the swapped memory was not noticed"
    aot.reset()
    with torch.inference_mode():
        torch.testing.assert_close(aot(module, x, bufs), module(x), rtol=0, atol=1e-6)
    assert aot.current(module)

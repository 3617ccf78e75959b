"""RoPE on its own: hand-worked rotations, position 0 is the identity, and q·k depends only on the distance.

The cached decoder and the oracle share ``rotary()``, so a rotation flipped or
shifted would pass every cache-versus-oracle test (issue 24): these tests
check RoPE against values worked out by hand, with no Hugging Face reference.

The convention (Su et al. 2021, "RoFormer", eq. 34, in the "halves" layout
Hugging Face's ``rotate_half`` uses): with ``d = head_dim``, the pair
``(x[i], x[i + d/2])`` at position ``p`` is rotated counter-clockwise by the
angle ``p * theta ** (-2 i / d)``::

    x[i]'       = x[i] cos a - x[i + d/2] sin a
    x[i + d/2]' = x[i + d/2] cos a + x[i] sin a
"""

from __future__ import annotations

import math

import pytest
import torch

from swkv_teach.model import apply_rotary, rotary


def rotate(x, positions, theta=10000.0, dtype=torch.float64):
    """x ``(T, d)`` rotated, through the library: one batch row, one head."""
    cos, sin = rotary(torch.as_tensor(positions), x.shape[-1], theta, dtype)
    return apply_rotary(x.to(dtype)[None, None], cos, sin)[0, 0]


def test_head_dim_2_is_a_plain_rotation_by_the_position_in_radians():
    """d = 2: one pair, frequency theta**0 = 1, so position p turns (1, 0) to (cos p, sin p), counter-clockwise."""
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [3.0, 4.0]])
    got = rotate(x, [0, 1, 2, 5])
    expected = torch.tensor([
        [1.0, 0.0],  # position 0: no rotation
        [math.cos(1), math.sin(1)],  # (0.5403, 0.8415)
        [-math.sin(2), math.cos(2)],  # (0, 1) turned by 2 rad: (-0.9093, -0.4161)
        [3 * math.cos(5) - 4 * math.sin(5), 4 * math.cos(5) + 3 * math.sin(5)],
    ], dtype=torch.float64)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert got[1, 1] > 0, "a positive angle turns (1, 0) towards +y: the rotation's sign"


def test_head_dim_4_pairs_dim_i_with_i_plus_half_at_frequency_theta_to_the_minus_2i_over_d():
    """d = 4, theta = 100: pairs (x0, x2) at 100**0 = 1 rad per position and (x1, x3) at 100**-0.5 = 0.1."""
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    a, b = 3 * 1.0, 3 * 0.1  # position 3
    expected = torch.tensor([[
        1 * math.cos(a) - 3 * math.sin(a),
        2 * math.cos(b) - 4 * math.sin(b),
        3 * math.cos(a) + 1 * math.sin(a),
        4 * math.cos(b) + 2 * math.sin(b),
    ]], dtype=torch.float64)
    torch.testing.assert_close(rotate(x, [3], theta=100.0), expected, rtol=0, atol=1e-6)


def test_rotary_returns_cos_and_sin_of_the_angles_in_the_halves_layout():
    """cos/sin ``(T, d)``: columns i and i + d/2 share the angle p * theta**(-2i/d); position 0 gives cos 1, sin 0."""
    cos, sin = rotary(torch.tensor([0, 2]), 4, 100.0, torch.float64)
    angles = torch.tensor([[0.0, 0.0, 0.0, 0.0], [2.0, 0.2, 2.0, 0.2]], dtype=torch.float64)
    torch.testing.assert_close(cos, angles.cos(), rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, angles.sin(), rtol=0, atol=1e-6)
    assert cos.dtype == sin.dtype == torch.float64
    assert rotary(torch.tensor([1]), 4, 100.0, torch.bfloat16)[0].dtype == torch.bfloat16


def test_position_zero_is_the_identity_and_every_rotation_keeps_the_norm():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 16, generator=g, dtype=torch.float64)
    torch.testing.assert_close(rotate(x, [0] * 6), x, rtol=0, atol=1e-12)
    y = rotate(x, [0, 1, 7, 100, 4095, 10**5])
    # the angles are float32 by design (rotary's docstring), so cos and sin carry float32's rounding
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-6, atol=0)


@pytest.mark.parametrize("d", [2, 8, 64])
def test_q_dot_k_depends_only_on_the_distance(d):
    """The relative-position property: <R_m q, R_n k> = <R_(m+s) q, R_(n+s) k> for any shift s."""
    g = torch.Generator().manual_seed(d)
    q, k = torch.randn(2, d, generator=g, dtype=torch.float64)

    def dot(m, n):
        return float(rotate(q[None], [m])[0] @ rotate(k[None], [n])[0])

    tol = 1e-4 * float(q.norm() * k.norm())  # float32 angles: about 1e-4 rad of rounding at position 1000
    for m, n in [(5, 2), (2, 5), (9, 9), (40, 1)]:
        ref = dot(m, n)
        for s in (1, 17, 1000):
            assert abs(dot(m + s, n + s) - ref) <= tol, (m, n, s, dot(m + s, n + s), ref)
    assert not math.isclose(dot(5, 2), dot(2, 5), rel_tol=1e-6), "distance +3 and -3 must differ: RoPE has a direction"


def test_rotating_by_m_then_n_is_rotating_by_m_plus_n():
    """Rotations compose: rotating a position-m vector again by n lands where position m + n does."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 8, generator=g, dtype=torch.float64)
    torch.testing.assert_close(rotate(rotate(x, [3]), [4]), rotate(x, [7]), rtol=0, atol=1e-6)
